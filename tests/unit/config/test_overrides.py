"""Hydra-style overrides: change / add / force-add / delete, value parsing, unknown keys, bad syntax."""

import pytest

from nemo_jetrl.config import ConfigError
from nemo_jetrl.config.overrides import apply_overrides, deep_merge

BASE = {"a": {"b": 0, "c": "x", "d": {"e": 1, "f": 2}}, "lst": [1, 2], "top": None}


def test_change_add_delete():
    out = apply_overrides(BASE, ["a.b=1", "+x.y=[1,2]", "~a.c", "top=5"])
    assert out == {"a": {"b": 1, "d": {"e": 1, "f": 2}}, "lst": [1, 2], "top": 5, "x": {"y": [1, 2]}}
    assert BASE["a"]["b"] == 0 and "c" in BASE["a"]  # input untouched


@pytest.mark.parametrize(
    "override, expected",
    [
        ("a.b=null", None),
        ("a.b=1e-5", 1e-5),
        ("a.b=abc", "abc"),
        ("a.b='1'", "1"),
        ("a.b=true", True),
        ("a.b=-3", -3),
        ("a.b=[1,[2,3]]", [1, [2, 3]]),
        ("a.b={k: v}", {"k": "v"}),
        ("a.b=${lst}", "${lst}"),  # interpolations stay strings until resolution
    ],
)
def test_value_parsing(override, expected):
    value = apply_overrides(BASE, [override])["a"]["b"]
    assert value == expected and type(value) is type(expected)


def test_dict_value_merges_into_existing_dict():
    assert apply_overrides(BASE, ["a.d={f: 9, g: 3}"])["a"]["d"] == {"e": 1, "f": 9, "g": 3}


def test_force_add_sets_new_or_existing():
    out = apply_overrides(BASE, ["++a.b=7", "++n.m=8"])
    assert out["a"]["b"] == 7 and out["n"] == {"m": 8}


def test_delete_only_if_value_matches():
    assert "c" not in apply_overrides(BASE, ["~a.c=x"])["a"]
    with pytest.raises(ConfigError, match=r"cannot delete 'a\.c': its value is 'x', not 'y'"):
        apply_overrides(BASE, ["~a.c=y"])


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigError) as err:
        apply_overrides(BASE, ["nope.key=1"])
    assert str(err.value) == "unknown key 'nope.key' in override 'nope.key=1'; to add a new key use '+nope.key=1'"


def test_unknown_key_suggests_a_close_key():
    with pytest.raises(ConfigError, match=r"unknown key 'f'.*did you mean 'a\.d\.f'\?"):
        apply_overrides(BASE, ["f=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'a\.dd\.e'.*did you mean 'a\.d\.e'\?"):
        apply_overrides(BASE, ["a.dd.e=1"])


def test_add_existing_key_fails():
    with pytest.raises(ConfigError, match=r"cannot add 'a\.b': the key already exists \(use 'a\.b=1'"):
        apply_overrides(BASE, ["+a.b=1"])


def test_delete_unknown_key_fails():
    with pytest.raises(ConfigError, match=r"cannot delete unknown key 'a\.zz'"):
        apply_overrides(BASE, ["~a.zz"])


def test_add_below_a_scalar_fails():
    with pytest.raises(ConfigError, match=r"'a\.b' is not a mapping") as info:
        apply_overrides(BASE, ["+a.b.c=1"])
    assert "set the whole mapping" not in str(info.value)  # a scalar, not a null mapping


def test_add_below_a_null_mapping_names_the_override_that_sets_it():
    """NeMo-RL's `policy.dtensor_cfg.env_vars` is null until set: the error gives the mapping form, quoted so that
    the value's ':' stays a string, and that form applies."""
    base = {"policy": {"dtensor_cfg": {"env_vars": None}}}
    with pytest.raises(ConfigError) as info:
        apply_overrides(base, ["+policy.dtensor_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"])
    form = """'policy.dtensor_cfg.env_vars={PYTORCH_CUDA_ALLOC_CONF:"expandable_segments:True"}'"""
    assert str(info.value).endswith(f"(its value is null); set the whole mapping: {form}")
    applied = apply_overrides(base, [form.strip("'")])
    assert applied["policy"]["dtensor_cfg"]["env_vars"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    with pytest.raises(ConfigError, match=r"set the whole mapping: 'policy=\{dtensor_cfg:\{x:\{y:1\}\}\}'"):
        apply_overrides({"policy": None}, ["+policy.dtensor_cfg.x.y=1"])


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("a.b", "expected key=value"),
        ("a.b=[1", "no viable alternative"),
        ("a b=1", "token recognition error at: ' '"),
        ("a.b=x]", "extraneous input ']'"),
        ("a..b=1", "token recognition error at: '.'"),
        ("=1", "missing or malformed key"),
        ("a.b=1,2", "sweeps are not supported"),
        ("a.b@pkg=1", "'@package' overrides are not supported"),
    ],
)
def test_bad_override_syntax(override, fragment):
    with pytest.raises(ConfigError) as err:
        apply_overrides(BASE, [override])
    message = str(err.value)
    assert message.startswith(f"bad override '{override}'") and fragment in message
    assert "\n" not in message and "http" not in message


def test_single_string_instead_of_list_is_refused():
    with pytest.raises(ConfigError, match="list of strings"):
        apply_overrides(BASE, "a.b=1")


def test_deep_merge_replaces_lists_and_scalars_and_copies():
    base = {"d": {"x": [1, 2], "y": 1}, "s": 1}
    merged = deep_merge(base, {"d": {"x": [3]}, "s": {"now": "dict"}})
    assert merged == {"d": {"x": [3], "y": 1}, "s": {"now": "dict"}}
    merged["d"]["x"].append(4)
    assert base["d"]["x"] == [1, 2]
