"""``runopts``: parsing ``-cfg`` strings as upstream does, resolving, and clear errors."""

from __future__ import annotations

import logging
from typing import Dict, List

import pytest

from torchx import specs
from torchx.specs.api import to_dict


def _opts() -> specs.runopts:
    opts = specs.runopts()
    opts.add("s", str, "a string")
    opts.add("i", int, "an int")
    opts.add("f", float, "a float")
    opts.add("b", bool, "a bool")
    opts.add("l", List[str], "a list")
    opts.add("d", Dict[str, str], "a dict")
    return opts


# the outputs upstream 0.7.0 gives for the same strings
@pytest.mark.parametrize(
    "cfg_str,expected",
    [
        ("", {}),
        ("s=x", {"s": "x"}),
        ("s=a,b", {"s": "a,b"}),
        ("s=a;b", {"s": "a;b"}),
        ("l=a,b", {"l": ["a", "b"]}),
        ("l=a;b;s=c", {"l": ["a", "b"], "s": "c"}),
        ("l=a,b,s=c", {"l": ["a", "b"], "s": "c"}),
        ("l=a,,b", {"l": ["a", "b"]}),
        ("l=a;", {"l": ["a"]}),
        ("d=k:v,k2:v2", {"d": {"k": "v", "k2": "v2"}}),
        ("d=k:v;k2:v2,s=x", {"d": {"k": "v", "k2": "v2"}, "s": "x"}),
        ("d=k:v:w", {"d": {"k": "v:w"}}),
        ("b=True", {"b": True}),
        ("b=true", {"b": True}),
        ("b=False", {"b": False}),
        ("i=3", {"i": 3}),
        ("f=1.5", {"f": 1.5}),
        ("f=2", {"f": 2.0}),
        ("s= x ", {"s": "x"}),
        ("s='q,r'", {"s": "'q,r'"}),
        ("s=''", {"s": ""}),
        ("s=x;i=1", {"s": "x", "i": 1}),
        (" s = y , i = 2 ", {"s": "y", "i": 2}),
        ("s=x,", {"s": "x,"}),
        ("s=x,unknown=1", {"s": "x"}),
        ("unknown=1", {}),
    ],
)
def test_cfg_from_str_matches_upstream(cfg_str: str, expected: Dict[str, object]) -> None:
    assert _opts().cfg_from_str(cfg_str) == expected


def test_unknown_keys_warn_or_raise_when_strict(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert _opts().cfg_from_str("s=x,nope=1") == {"s": "x"}
    assert "unknown run option 'nope'" in caplog.text
    with pytest.raises(specs.InvalidRunConfigException, match="Unknown run option 'nope'"):
        _opts().cfg_from_str("s=x,nope=1", strict=True)
    assert _opts().cfg_from_json_repr('{"l": ["x"], "i": 2, "nope": 1}') == {"l": ["x"], "i": 2}
    with pytest.raises(specs.InvalidRunConfigException, match="'nope'"):
        _opts().cfg_from_json_repr('{"nope": 1}', strict=True)


@pytest.mark.parametrize(
    "cfg_str,needle",
    [
        ("i=x", "'i' must be of type int"),
        ("b=1", "expected True or False"),  # upstream silently reads "1" as False
        ("b=yes", "expected True or False"),
        ("d=novalue", "expected key:value"),
        ("nokey", "expected KEY=VALUE"),
        ("=v", "expected KEY=VALUE"),
    ],
)
def test_bad_values_are_one_line_errors(cfg_str: str, needle: str) -> None:
    with pytest.raises(specs.InvalidRunConfigException, match=needle) as e:
        _opts().cfg_from_str(cfg_str)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)  # upstream raised ValueError for these


def test_to_dict_is_upstreams_pair_splitter() -> None:
    assert to_dict("FOO=v1,v2,BAR=v3") == {"FOO": "v1,v2", "BAR": "v3"}
    assert to_dict("FOO=v1;v2;BAR=v3") == {"FOO": "v1;v2", "BAR": "v3"}
    assert to_dict('FOO=""') == {"FOO": ""}
    assert to_dict("") == {}
    assert to_dict("A=x=y") == {"A": "x=y"}  # upstream could not split this at all


def test_resolve_fills_defaults_and_checks_types() -> None:
    opts = specs.runopts()
    opts.add("queue", str, "the queue", required=True)
    opts.add("n", int, "count", default=1)
    opts.add("rate", float, "rate", default=0.5)
    assert opts.resolve({"queue": "q"}) == {"queue": "q", "n": 1, "rate": 0.5}
    assert opts.resolve({"queue": "q", "rate": 2})["rate"] == 2.0
    with pytest.raises(specs.InvalidRunConfigException, match="Required run option 'queue'"):
        opts.resolve({})
    with pytest.raises(specs.InvalidRunConfigException, match="must be of type int"):
        opts.resolve({"queue": "q", "n": "three"})
    with pytest.raises(specs.InvalidRunConfigException, match="must be of type int"):
        opts.resolve({"queue": "q", "n": True})


def test_add_checks_defaults() -> None:
    opts = specs.runopts()
    with pytest.raises(TypeError):
        opts.add("bad", int, "x", default="1")
    with pytest.raises(ValueError):
        opts.add("bad", int, "x", default=1, required=True)


def test_repr_is_the_runopts_help_upstream_prints() -> None:
    opts = specs.runopts()
    opts.add("q", str, "queue", required=True)
    opts.add("n", int, "n", default=3)
    assert repr(opts) == (
        "    usage:\n        q=Q,[n=N]\n\n    required arguments:\n        q=Q (str)\n"
        "            queue\n\n    optional arguments:\n        n=N (int, 3)\n            n"
    )
    assert specs.get_type_name(List[str]) == "typing.List[str]"
    assert specs.get_type_name(int) == "int"


def test_resolve_rejects_an_unknown_key_naming_it_and_the_valid_ones() -> None:
    """Upstream kept unknown keys, so a typo in a Python caller's cfg was dropped without a
    word; every submission path resolves its cfg with the scheduler's name, so this one check
    covers them all."""
    opts = specs.runopts()
    opts.add("partition", str, "where")
    opts.add("time", str, "how long")
    with pytest.raises(specs.InvalidRunConfigException) as e:
        opts.resolve({"partion": "gpu"}, "slurm")
    assert e.value.cfg_key == "partion"
    assert e.value.invalid_reason == (
        "Unknown run option 'partion' (did you mean 'partition'?); valid options of the slurm"
        " scheduler are: partition, time"
    )
    with pytest.raises(specs.InvalidRunConfigException, match="'zzz'; valid options are"):
        opts.check_known({"zzz": "1"})
    # without a scheduler's name, as upstream: a cfg may hold several schedulers' options
    assert opts.resolve({"zzz": "1"})["zzz"] == "1"
