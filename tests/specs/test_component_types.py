"""``torchx.util.types``: the component argument types and how strings decode into them."""

from __future__ import annotations

import inspect
from typing import Dict, List, Optional, Union

import pytest

from torchx.util.types import (
    decode,
    decode_from_string,
    decode_optional,
    get_argparse_param_type,
    is_bool,
    is_primitive,
    none_throws,
    to_list,
)


def test_type_predicates_as_upstream() -> None:
    assert is_bool(bool) and not is_bool(int)
    assert all(is_primitive(t) for t in (int, str, float))
    assert not is_primitive(bool) and not is_primitive(List[str])


def test_decode_optional_unwraps_every_spelling() -> None:
    assert decode_optional(Optional[int]) is int
    assert decode_optional(Union[str, None]) is str
    assert decode_optional(int | None) is int
    assert decode_optional(None | int) is int  # upstream left this one wrapped
    assert decode_optional(List[str]) == List[str]
    assert decode_optional(Union[int, str]) == Union[int, str]


def test_get_argparse_param_type() -> None:
    kind = inspect.Parameter.KEYWORD_ONLY
    types = [int, float, str, bool, List[str], inspect.Parameter.empty]
    params = [inspect.Parameter(f"p{i}", kind, annotation=t) for i, t in enumerate(types)]
    assert [get_argparse_param_type(p) for p in params] == [int, float, str, str, str, str]


def test_decode_from_string() -> None:
    assert decode_from_string("a=1,b=2", Dict[str, int]) == {"a": 1, "b": 2}
    assert decode_from_string("1,2", List[int]) == [1, 2]
    assert decode_from_string("x, y", List[str]) == ["x", "y"]
    assert decode_from_string("", List[str]) is None
    assert decode_from_string("a=1", Dict[str, object]) == {"a": "1"}  # upstream: TypeError
    with pytest.raises(ValueError, match="cannot be given on the command line"):
        decode_from_string("x", set)


def test_decode() -> None:
    assert decode("True", bool) is True and decode("false", bool) is False
    assert decode("3", Optional[int]) == 3  # upstream returned the string "3"
    assert decode("None", Optional[str]) is None
    assert decode(None, int) is None
    assert decode(["a"], List[str]) == ["a"]  # already typed (from a dict): kept
    with pytest.raises(ValueError, match="expected True or False"):
        decode("maybe", bool)


def test_to_list_and_none_throws() -> None:
    assert to_list("") == [] and to_list(" a , b ") == ["a", "b"]
    assert none_throws(0) == 0
    with pytest.raises(AssertionError, match="was None"):
        none_throws(None, "was None")
