"""Component argument parsing: upstream's parser and Namespace, our one-line errors."""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional

import pytest

import torchx
import torchx.specs as specs
from torchx.components import dist, utils
from torchx.specs.builders import (
    ComponentArgumentError,
    ComponentHelpRequest,
    _create_args_parser,
    materialize_appdef,
    parse_args,
)


@pytest.mark.parametrize("fn", [utils.touch, utils.copy, utils.binary, utils.echo, dist.ddp])
def test_help_needs_no_other_arguments(fn: object, capsys: pytest.CaptureFixture[str]) -> None:
    # upstream's ComponentTestCase.validate does exactly this
    with pytest.raises(SystemExit) as e:
        _create_args_parser(fn).parse_args(["--help"])  # type: ignore[arg-type]
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: torchx run <run args...> ")


def test_parse_args_namespace_is_upstreams() -> None:
    ns = parse_args(utils.echo, ["--msg", "hi"])
    assert ns == argparse.Namespace(msg="hi", image=torchx.IMAGE, num_replicas=1)
    ns = parse_args(utils.sh, ["--num_replicas", "2", "echo", "a b"])
    assert ns.args == ["echo", "a b"] and ns.num_replicas == 2 and ns.env is None
    ns = parse_args(dist.ddp, ["--script", "t.py"], cmpnt_defaults={"j": "2x4"})
    assert ns.j == "2x4" and ns.debug == "False" and ns.script_args == []
    ns = parse_args(utils.touch, [], config={"file": "f"})
    assert ns.file == "f"


def test_one_letter_parameters_get_both_flags() -> None:
    assert parse_args(dist.ddp, ["-j", "2x1", "--m", "x"]).j == "2x1"
    assert parse_args(dist.ddp, ["--j", "2x1", "-m", "x"]).m == "x"


def _comp(
    *args: str,
    n: int = 1,
    f: float = 0.5,
    flag: bool = False,
    tags: Optional[List[str]] = None,
    env: Optional[Dict[str, str]] = None,
    x: Optional[int] = None,
) -> specs.AppDef:
    """A test component.

    Args:
        args: the program's arguments
        n: how many
    """
    out = repr((args, n, f, flag, tags, env, x))
    return specs.AppDef("c", [specs.Role("r", "i", entrypoint="e", args=[out])])


def _out(app: specs.AppDef) -> str:
    return app.roles[0].args[0]


def test_materialize_decodes_every_supported_type() -> None:
    app = materialize_appdef(
        _comp,
        ["-n", "3", "--flag", "True", "--tags", "a,b", "--env", "A=1,B=x,y", "-x", "7"]
        + ["--", "--not-a-flag", "v"],
    )
    assert _out(app) == repr(
        (("--not-a-flag", "v"), 3, 0.5, True, ["a", "b"], {"A": "1", "B": "x,y"}, 7)
    )


def test_defaults_from_config_files_and_typed_config() -> None:
    app = materialize_appdef(_comp, [], cmpnt_defaults={"n": "4", "args": "-a b"})
    assert _out(app).startswith("(('-a', 'b'), 4,")
    app = materialize_appdef(_comp, ["-n", "5"], cmpnt_defaults={"n": "4"})
    assert _out(app).startswith("((), 5,")
    app = materialize_appdef(_comp, [], config={"n": 6, "flag": True, "args": ["z"]})
    assert _out(app).startswith("(('z',), 6, 0.5, True,")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--flag", "maybe"], "argument --flag: expected True or False"),
        (["-n", "two"], "argument -n/--n: expected int, got 'two'"),
        (["-x", "two"], "argument --x: expected int"),
        (["--bogus", "1"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_one_line_errors(args: List[str], needle: str) -> None:
    with pytest.raises(ComponentArgumentError, match=needle) as e:
        materialize_appdef(_comp, args)
    assert "\n" not in str(e.value)


def test_required_unknown_kwargs_and_return_type() -> None:
    with pytest.raises(
        ComponentArgumentError, match="the following arguments are required: --file"
    ):
        materialize_appdef(utils.touch, [])
    with pytest.raises(ComponentArgumentError, match="unknown argument"):
        materialize_appdef(_comp, [], config={"zzz": 1})

    def kw(**kwargs: str) -> specs.AppDef:
        return specs.AppDef("x")

    with pytest.raises(ComponentArgumentError, match="kwargs are not supported"):
        materialize_appdef(kw, [])

    def not_an_app(a: int = 1) -> specs.AppDef:
        return "nope"  # type: ignore[return-value]

    with pytest.raises(TypeError, match="returned str, expected AppDef"):
        materialize_appdef(not_an_app, [])


def test_help_inside_materialize_is_returned_not_exited() -> None:
    with pytest.raises(ComponentHelpRequest) as e:
        materialize_appdef(_comp, ["-n", "2", "--help"])
    text = e.value.text
    assert "A test component." in text
    assert "-n int, --n int      how many (default: 1)" in text


def test_string_annotations_decode_by_type_hints() -> None:
    namespace: Dict[str, object] = {"specs": specs}
    exec(
        "from __future__ import annotations\n"
        "from typing import Optional\n"
        "def comp(n: int = 1, t: Optional[float] = None) -> specs.AppDef:\n"
        "    return specs.AppDef('c', [specs.Role('r', 'i', args=[repr((n, t))])])\n",
        namespace,
    )
    app = materialize_appdef(namespace["comp"], ["--n", "3", "--t", "0.5"])  # type: ignore[arg-type]
    assert app.roles[0].args == [repr((3, 0.5))]
