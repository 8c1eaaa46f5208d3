"""load_config: `defaults:` inheritance, cycles, file errors, resolvers and resolution order."""

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from nemo_jetrl.config import ConfigError, load_config, register_resolvers


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_three_level_defaults_chain_precedence(tmp_path):
    write(tmp_path / "base" / "root.yaml", "a: {x: 1, y: 1, z: 1, keep: root}\nlst: [1, 2, 3]\nonly_root: r\n")
    write(tmp_path / "base" / "mid.yaml", "defaults: root.yaml\na: {y: 2, z: 2}\nlst: [9]\n")
    top = write(tmp_path / "top.yaml", "defaults: base/mid.yaml\na: {z: 3}\nnew_top: t\n")
    cfg = load_config(top)
    assert isinstance(cfg, DictConfig)
    assert OmegaConf.to_container(cfg) == {
        "a": {"x": 1, "y": 2, "z": 3, "keep": "root"},
        "lst": [9],  # lists are replaced, not merged
        "only_root": "r",
        "new_top": "t",
    }
    assert "defaults" not in cfg


def test_list_defaults_later_items_override_earlier(tmp_path):
    write(tmp_path / "one.yaml", "k: 1\nfrom_one: true\nd: {p: 1, q: 1}\n")
    write(tmp_path / "two.yaml", "k: 2\nfrom_two: true\nd: {q: 2}\n")
    top = write(tmp_path / "top.yaml", "defaults: [one.yaml, two.yaml]\nd: {r: 3}\n")
    assert OmegaConf.to_container(load_config(top)) == {
        "k": 2,
        "from_one": True,
        "from_two": True,
        "d": {"p": 1, "q": 2, "r": 3},
    }


def test_diamond_defaults_are_not_a_cycle(tmp_path):
    write(tmp_path / "common.yaml", "c: 0\n")
    write(tmp_path / "left.yaml", "defaults: common.yaml\nl: 1\n")
    write(tmp_path / "right.yaml", "defaults: common.yaml\nr: 2\n")
    top = write(tmp_path / "top.yaml", "defaults: [left.yaml, right.yaml]\n")
    assert OmegaConf.to_container(load_config(top)) == {"c": 0, "l": 1, "r": 2}


def test_defaults_cycle_reports_the_chain(tmp_path):
    write(tmp_path / "a.yaml", "defaults: b.yaml\nx: 1\n")
    write(tmp_path / "b.yaml", "defaults: sub/c.yaml\n")
    write(tmp_path / "sub" / "c.yaml", "defaults: ../a.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "a.yaml")
    message = str(err.value)
    assert message.startswith("defaults cycle: ")
    chain = [Path(p).name for p in message.removeprefix("defaults cycle: ").split(" -> ")]
    assert chain == ["a.yaml", "b.yaml", "c.yaml", "a.yaml"]


def test_self_include_is_a_cycle(tmp_path):
    top = write(tmp_path / "self.yaml", "defaults: self.yaml\n")
    with pytest.raises(ConfigError, match=r"defaults cycle: .*self\.yaml -> .*self\.yaml"):
        load_config(top)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match=r"config file not found: .*nope\.yaml$"):
        load_config(tmp_path / "nope.yaml")


def test_missing_default_names_path_and_includer(tmp_path):
    top = write(tmp_path / "top.yaml", "defaults: [gone.yaml]\n")
    with pytest.raises(ConfigError) as err:
        load_config(top)
    assert "gone.yaml" in str(err.value) and "top.yaml" in str(err.value)


def test_yaml_syntax_error_reports_file_and_line(tmp_path):
    bad = write(tmp_path / "bad.yaml", "a: 1\nb:\n  c: [1, 2\n  d: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    message = str(err.value)
    assert message.startswith(f"{bad}:4:4: YAML syntax error: expected ',' or ']', but got ':'")
    assert message.endswith("(while parsing a flow sequence started at line 3)")
    assert "\n" not in message


def test_duplicate_key_is_a_syntax_error_with_line(tmp_path):
    bad = write(tmp_path / "dup.yaml", "a: 1\nb: 2\na: 3\n")
    with pytest.raises(ConfigError, match=rf"{bad}:3:1: YAML syntax error: found duplicate key a"):
        load_config(bad)


@pytest.mark.parametrize("text", ["defaults: 3\n", "defaults: [a.yaml, 2]\n", "defaults: {a: 1}\n"])
def test_bad_defaults_value(tmp_path, text):
    top = write(tmp_path / "top.yaml", text)
    with pytest.raises(ConfigError, match=r"top\.yaml: 'defaults' must be a path or a list of paths"):
        load_config(top)


def test_top_level_list_is_refused(tmp_path):
    top = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(top)


def test_resolvers_and_resolution_after_overrides(tmp_path):
    top = write(
        tmp_path / "r.yaml",
        "n: 4\nm: 8\nprod: ${mul:${n},${m}}\nsum3: ${add:${n},${m},1}\nq: ${div:${m},${n}}\nbig: ${max:${n},${m}}\n"
        "name: ${model}\nmodel: tiny\n",
    )
    cfg = load_config(top, ["n=16", "model=other"])
    assert (cfg.prod, cfg.sum3, cfg.q, cfg.big, cfg.name) == (128, 25, 0.5, 16, "other")
    assert type(cfg.prod) is int and type(cfg.q) is float


def test_register_resolvers_is_idempotent():
    register_resolvers()
    register_resolvers()
    assert all(OmegaConf.has_resolver(name) for name in ("mul", "add", "div", "max"))


def test_unresolvable_interpolation_names_the_key(tmp_path):
    top = write(tmp_path / "i.yaml", "a:\n  b: ${nowhere.key}\n")
    with pytest.raises(ConfigError, match=r"^a\.b: Interpolation key 'nowhere\.key' not found"):
        load_config(top)


def test_resolver_error_names_the_key(tmp_path):
    top = write(tmp_path / "z.yaml", "a: {q: '${div:1,0}'}\n")
    with pytest.raises(ConfigError, match=r"^a\.q: .*division by zero"):
        load_config(top)


def test_mandatory_missing_value_is_reported(tmp_path):
    top = write(tmp_path / "m.yaml", "a:\n  b: ???\n")
    with pytest.raises(ConfigError, match=r"missing mandatory value '\?\?\?' for a\.b"):
        load_config(top)
    assert load_config(top, ["a.b=3"]).a.b == 3


def test_grpo_base_interpolations(repo_root):
    cfg = load_config(repo_root / "examples/configs/grpo_base.yaml", ["policy.precision=bf16", "policy.model_name=m"])
    assert cfg.policy.generation.precision == "bf16"
    assert cfg.policy.tokenizer.name == "m"
    assert cfg.policy.train_global_batch_size == cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt
