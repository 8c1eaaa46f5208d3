"""examples/run_grpo.py: user errors exit 2 with one `error: ...` line and no traceback; --validate-only works."""

import sys
import types
from pathlib import Path

import pytest
from jetrl_testkit.cli import load_script, run_main, run_script
from omegaconf import DictConfig

from nemo_jetrl.schema import MasterConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = REPO_ROOT / "examples" / "run_grpo.py"
BASE = REPO_ROOT / "examples" / "configs" / "grpo_base.yaml"

# case name -> (extra argv, fragment the one-line stderr message must contain); {tmp} is a per-session folder.
USER_ERRORS = {
    "missing_file": (["--config", "{tmp}/nope.yaml"], "config file not found: {tmp}/nope.yaml"),
    "config_is_a_directory": (["--config", "{tmp}"], "cannot read config file {tmp}"),
    "yaml_syntax": (["--config", "{tmp}/bad.yaml"], "{tmp}/bad.yaml:4:1: YAML syntax error: expected ',' or ']'"),
    "defaults_cycle": (["--config", "{tmp}/cycle_a.yaml"], "defaults cycle: {tmp}/cycle_a.yaml -> "),
    "unknown_key": (["nope.key=1"], "unknown key 'nope.key'"),
    "bad_value": (["policy.generation.kv_cache_dtype=fp9"], "policy.generation.kv_cache_dtype: 'fp9' is not one of"),
    "cross_field": (["policy.train_micro_batch_size=48"], "policy.train_micro_batch_size (48)"),
    "bad_override_syntax": (["policy.precision=[fp8"], "bad override 'policy.precision=[fp8'"),
    "unknown_option": (["--cofig", "x.yaml"], "unrecognized arguments: --cofig"),
}


def _write_bad_configs(tmp: Path) -> None:
    (tmp / "bad.yaml").write_text(f"defaults: {BASE}\npolicy:\n  precision: [fp8\n")
    (tmp / "cycle_a.yaml").write_text("defaults: cycle_b.yaml\n")
    (tmp / "cycle_b.yaml").write_text("defaults: cycle_a.yaml\n")


@pytest.fixture(scope="module")
def run_grpo_main():
    return load_script(SCRIPT, "run_grpo_script").main


@pytest.fixture(scope="module")
def cli_tmp(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    _write_bad_configs(tmp)
    return tmp


def _cases(tmp: Path) -> dict[str, list[str]]:
    cases = {name: [a.format(tmp=tmp) for a in argv] for name, (argv, _) in USER_ERRORS.items()}
    cases["validate_only"] = ["--config", str(BASE), "--validate-only", "grpo.max_num_steps=7"]
    cases["help"] = ["--help"]
    return cases


@pytest.fixture(scope="module")
def cli_results(run_grpo_main, cli_tmp) -> dict[str, tuple[int, str, str]]:
    """Every CLI case through the script's main() in this process: name -> (status, stdout, stderr); the
    fresh-interpreter run of one case (below) shows the process gives the same (jetrl_testkit/cli.py)."""
    return {name: run_main(run_grpo_main, argv) for name, argv in _cases(cli_tmp).items()}


def test_the_script_as_a_process_gives_what_main_gives_in_process(cli_results, cli_tmp):
    """`python run_grpo.py ...` (a fresh interpreter, the full config-path imports) for a case that gets through
    argparse and the YAML loader to the schema's cross-field check: exit status, stdout and stderr as in-process."""
    process = run_script(SCRIPT, _cases(cli_tmp)["cross_field"])
    assert process == cli_results["cross_field"]


@pytest.mark.parametrize("case", sorted(USER_ERRORS))
def test_user_error_exits_2_with_one_line(cli_results, cli_tmp, case):
    rc, out, err = cli_results[case]
    fragment = USER_ERRORS[case][1].format(tmp=cli_tmp)
    assert rc == 2, (out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]
    assert out == ""


def test_validate_only_prints_resolved_config_and_exits_0(cli_results):
    rc, out, err = cli_results["validate_only"]
    assert rc == 0, err
    assert err == ""
    assert "max_num_steps=7" in out
    assert "train_global_batch_size=256" in out  # ${mul:...} resolved
    assert "kv_cache_dtype=auto" in out and "kv_cache_calibration" in out
    assert len(out.splitlines()) < 80  # compact (one tree line per section, wrapped at 80 columns; 70 lines today)


def test_help_explains_usage_with_an_example(cli_results):
    rc, out, _ = cli_results["help"]
    assert rc == 0
    assert "--config PATH" in out and "--validate-only" in out
    assert "uv run examples/run_grpo.py --config examples/configs/grpo_base.yaml" in out
    assert "+a.new=value" in out and "~a.b" in out


# ---- in-process: the hand-off to nemo_jetrl.algorithms.grpo.run_grpo ------------------------------------------


def test_calls_run_grpo_with_validated_and_resolved_config(run_grpo_main, monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("nemo_jetrl.algorithms.grpo")
    fake.run_grpo = lambda master_cfg, resolved: calls.append((master_cfg, resolved))
    monkeypatch.setitem(sys.modules, "nemo_jetrl.algorithms.grpo", fake)
    assert run_grpo_main(["--config", str(BASE), "grpo.seed=3", "policy.precision=bf16"]) == 0
    ((master_cfg, resolved),) = calls
    assert isinstance(master_cfg, MasterConfig) and isinstance(resolved, DictConfig)
    assert master_cfg.grpo.seed == 3 and resolved.grpo.seed == 3
    assert master_cfg.policy.generation.precision == "bf16"
    assert "seed=3" in capsys.readouterr().out


def test_run_time_user_error_is_one_line_exit_1(run_grpo_main, monkeypatch, capsys):
    fake = types.ModuleType("nemo_jetrl.algorithms.grpo")

    def bad_model_dir(master_cfg, resolved):
        raise ValueError("policy.model_name: /nope is not a directory")

    fake.run_grpo = bad_model_dir
    monkeypatch.setitem(sys.modules, "nemo_jetrl.algorithms.grpo", fake)
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    assert run_grpo_main(["--config", str(BASE)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: policy.model_name: /nope is not a directory (set NEMO_JETRL_TRACEBACK=1 for the traceback)"]
    monkeypatch.setenv("NEMO_JETRL_TRACEBACK", "1")
    with pytest.raises(ValueError, match="/nope"):
        run_grpo_main(["--config", str(BASE)])
