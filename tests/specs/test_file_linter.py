"""The component linter reports what upstream's reports, with upstream's messages."""

from __future__ import annotations

import argparse
import ast
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable, List

import pytest

from torchx.specs.file_linter import (
    LinterMessage,
    TorchXArgumentHelpFormatter,
    TorchxFunctionValidator,
    get_fn_docstring,
    parse_source,
    validate,
)

HEADER = (
    "from typing import Dict, List, Optional, Set\nimport typing\nimport torchx.specs as specs\n"
)


def _lint(tmp_path: Path, body: str, fn: str = "comp") -> List[str]:
    path = tmp_path / "comp.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return [m.description for m in validate(str(path), fn)]


@pytest.mark.parametrize(
    "params",
    [
        "a: int, b: str = 'x', c: float = 1.0, d: bool = False",
        "a: Optional[int] = None, b: int | None = None, c: None | str = None",
        "a: List[str], b: list[int], c: Dict[str, int], d: dict[str, str]",
        "a: Optional[Dict[str, str]] = None, b: Optional[List[int]] = None",
        "a: 'int', b: typing.List[str], c: typing.Optional[str] = None",
        "*args: str, a: int = 1",
        "a: object = None, b: Dict[str, object] = None",  # upstream accepts any bare name
    ],
)
def test_decodable_parameters_pass(tmp_path: Path, params: str) -> None:
    assert _lint(tmp_path, f"def comp({params}) -> specs.AppDef:\n    ...\n") == []


@pytest.mark.parametrize(
    "params,expected",
    [
        ("a, b: int", ["Arg a missing type annotation"]),
        ("*args", ["Arg args missing type annotation"]),
        ("*, k", ["Arg k missing type annotation"]),
        ("a: Set[str]", ["`comp` allows only Dict, List as complex types.Argument `a` has: Set"]),
        ("a: List[List[str]]", ["List can only have primitive types"]),
        ("a: Optional[List[Dict[str, str]]]", ["List can only have primitive types"]),
        ("a: Dict[str, List[str]]", ["Dict can only have primitive types"]),
        ("a: Dict[List[str], List[str]]", ["Dict can only have primitive types"] * 2),
        ("**kw: str", ["Arg **kw: **kwargs are not supported for component definitions"]),
    ],
)
def test_undecodable_parameters_are_reported(
    tmp_path: Path, params: str, expected: List[str]
) -> None:
    assert _lint(tmp_path, f"def comp({params}) -> specs.AppDef:\n    ...\n") == expected


def test_messages_carry_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.py"
    path.write_text(
        "import torchx.specs as specs\n\n"
        "def comp(\n    a: int,\n    b,\n) -> specs.AppDef:\n    ...\n"
    )
    [msg] = validate(str(path), "comp")
    assert msg == LinterMessage("TorchxFunctionValidator", "Arg b missing type annotation", 5, 0)


@pytest.mark.parametrize(
    "returns,expected",
    [
        ("-> specs.AppDef", []),
        ("-> AppDef", []),
        ("-> 'AppDef'", []),
        ("-> 'specs.AppDef'", []),
        (
            "",
            [
                "Function: comp missing return annotation or has unknown annotations."
                " Supported return annotation: AppDef"
            ],
        ),
        (
            "-> int",
            ["Function: comp has incorrect return annotation, supported annotation: AppDef"],
        ),
    ],
)
def test_return_annotation(tmp_path: Path, returns: str, expected: List[str]) -> None:
    assert _lint(tmp_path, f"def comp(a: int) {returns}:\n    ...\n") == expected


def test_missing_function_syntax_error_and_binary_file(tmp_path: Path) -> None:
    assert _lint(tmp_path, "def other() -> specs.AppDef:\n    ...\n") == ["Function comp not found"]
    bad = tmp_path / "bad.py"
    bad.write_text("def comp(:\n")
    [msg] = validate(str(bad), "comp")
    assert msg.name == "TorchXValidator" and msg.line == 1 and msg.description
    binary = tmp_path / "bin.py"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    [msg] = validate(str(binary), "comp")
    assert "is not a text file" in msg.description


def test_custom_validators_replace_the_defaults(tmp_path: Path) -> None:
    class NoDefaults(TorchxFunctionValidator):
        def validate(self, app_specs_func_def: ast.FunctionDef) -> List[LinterMessage]:
            if app_specs_func_def.args.defaults:
                return [self._gen_linter_message("no defaults please", app_specs_func_def.lineno)]
            return []

    path = tmp_path / "c.py"
    path.write_text("def comp(a, b=1):\n    ...\n")  # untyped, no return: only ours runs
    assert [m.description for m in validate(str(path), "comp", [NoDefaults()])] == [
        "no defaults please"
    ]


def _documented(a: str, b: int = 1, *args: str) -> None:
    """Short line.

    A longer description.

    Args:
        a: the a
        *args: the rest
    """


def _undocumented(a: str) -> None:
    pass


def test_get_fn_docstring() -> None:
    desc, args = get_fn_docstring(_documented)
    assert desc == "Short line.\nA longer description."
    assert args == {"a": "the a", "b": " ", "args": "the rest"}
    desc, args = get_fn_docstring(_undocumented)
    assert desc.startswith("_undocumented TIP: improve this help string by adding a docstring\n")
    assert args == {"a": " "}


def _parser(add: Callable[[argparse.ArgumentParser], None]) -> str:
    parser = argparse.ArgumentParser(
        prog="p", formatter_class=TorchXArgumentHelpFormatter, add_help=False
    )
    parser.add_argument("--help", action="help", default=argparse.SUPPRESS, help="show help")
    add(parser)
    return parser.format_help()


def test_help_formatter_marks_required_and_defaults() -> None:
    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--need", type=str, required=True, help="needed")
        parser.add_argument("--n", type=int, default=3, help="count")

    text = _parser(add)
    assert "--help      show help\n" in text
    assert "--need str  needed (required)" in text
    assert "--n int     count (default: 3)" in text


def test_parses_in_threads_at_once_all_succeed() -> None:
    """CPython 3.11's AST builder shares one depth counter between threads, so ``ast.parse``
    fails ("recursion depth mismatch") when another thread parses meanwhile, as a Prefect
    flow's engine does while a TorchXJob block submits; ``parse_source`` parses again."""
    source = Path(ast.__file__).read_text() * 4
    errors: List[str] = []

    class Finalized:
        def __del__(self) -> None:  # Python code run by the collector: a thread switch
            sum(range(200))

    def parse_for_a_while() -> None:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            for _ in range(50):
                garbage = Finalized()
                garbage.cycle = garbage  # type: ignore[attr-defined]
            try:
                parse_source(source)
            except SystemError as e:
                errors.append(str(e))

    threads = [threading.Thread(target=parse_for_a_while) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
