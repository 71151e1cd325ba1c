"""The component linter: checks a component function's source (its AST, nothing is run)
with upstream's messages, and accepts what the decoder handles beyond upstream 0.7.0
(``T | None``, ``list[str]``, string annotations)."""

from __future__ import annotations

import abc
import argparse
import ast
import functools
import inspect
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, cast

from torchx.util.io import read_conf_file

_DOC_URL = "https://pytorch.org/torchx/latest/component_best_practices.html"


class TorchXArgumentHelpFormatter(
    argparse.RawDescriptionHelpFormatter,
    argparse.ArgumentDefaultsHelpFormatter,
    argparse.MetavarTypeHelpFormatter,
):
    """Help formatter that ends each argument's help with ``(required)`` or ``(default: X)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if action.default is argparse.SUPPRESS:  # only --help
            return help
        return help + (" (required)" if action.required else f" (default: {action.default})")


def get_fn_docstring(fn: Callable[..., object]) -> Tuple[str, Dict[str, str]]:
    """``(description, {arg: help})`` from ``fn``'s Google-style docstring; an undocumented
    argument gets ``" "`` (argparse drops empty help)."""
    default_desc = (
        f"{fn.__name__} TIP: improve this help string by adding a docstring\n"
        f"to your component (see: {_DOC_URL})"
    )
    args_desc = {name: " " for name in inspect.signature(fn).parameters}
    doc = inspect.getdoc(fn)
    if not doc:
        return default_desc, args_desc
    import docstring_parser

    parsed = docstring_parser.parse(doc)
    for param in parsed.params:
        if param.description is not None:
            args_desc[param.arg_name.lstrip("*")] = param.description
    desc = parsed.short_description or default_desc
    if parsed.long_description:
        desc += "\n" + parsed.long_description
    return desc, args_desc


@dataclass
class LinterMessage:
    name: str
    description: str
    line: int
    char: int
    severity: str = "error"


class TorchxFunctionValidator(abc.ABC):
    """One rule applied to the component function's ``ast.FunctionDef``."""

    @abc.abstractmethod
    def validate(self, app_specs_func_def: ast.FunctionDef) -> List[LinterMessage]:
        raise NotImplementedError()

    def _gen_linter_message(self, description: str, lineno: int) -> LinterMessage:
        return LinterMessage("TorchxFunctionValidator", description, lineno, 0, "error")


def _name_of(node: ast.expr) -> Optional[str]:
    """``List`` for ``List``, ``typing.List`` and ``t.List``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _unwrap_optional(node: ast.expr) -> ast.expr:
    """``T`` for ``Optional[T]``, ``T | None`` and ``None | T``; else ``node``."""
    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if isinstance(node.right, ast.Constant) and node.right.value is None:
            return node.left
        if isinstance(node.left, ast.Constant) and node.left.value is None:
            return node.right
    return node


def parse_source(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """``ast.parse``, tried again on CPython 3.11's spurious ``SystemError`` ("AST constructor
    recursion depth mismatch"): its AST builder keeps one depth counter per interpreter, so a
    parse fails when another thread parses at the same time (a Prefect flow's engine does)."""
    for attempt in range(1, 5):
        try:
            return ast.parse(source, filename=filename, mode=mode)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e):
                raise
            time.sleep(0.01 * attempt)
    return ast.parse(source, filename=filename, mode=mode)  # the fifth try: its error stands


def _from_string(node: ast.expr) -> ast.expr:
    """The expression of a string annotation (``x: "int"``), else ``node``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return cast(ast.Expression, parse_source(node.value, mode="eval")).body
        except SyntaxError:
            return node
    return node


class TorchxFunctionArgsValidator(TorchxFunctionValidator):
    """Every parameter is annotated with a type the component argument parser can decode."""

    def validate(self, app_specs_func_def: ast.FunctionDef) -> List[LinterMessage]:
        fn_args = app_specs_func_def.args
        errors: List[LinterMessage] = []
        params = [*fn_args.posonlyargs, *fn_args.args]
        params += [fn_args.vararg] if fn_args.vararg else []
        for arg in [*params, *fn_args.kwonlyargs]:
            errors += self._validate_arg_def(app_specs_func_def.name, arg)
        if fn_args.kwarg:
            errors.append(
                self._gen_linter_message(
                    f"Arg **{fn_args.kwarg.arg}: **kwargs are not supported for component"
                    " definitions",
                    fn_args.kwarg.lineno,
                )
            )
        return errors

    def _validate_arg_def(self, function_name: str, arg_def: ast.arg) -> List[LinterMessage]:
        if not arg_def.annotation:
            return [
                self._gen_linter_message(
                    f"Arg {arg_def.arg} missing type annotation", arg_def.lineno
                )
            ]
        ann = _unwrap_optional(_from_string(arg_def.annotation))
        ann = _unwrap_optional(_from_string(ann))
        if isinstance(ann, (ast.Name, ast.Attribute)):
            return []
        if not isinstance(ann, ast.Subscript):
            desc = (
                f"`{function_name}` allows only primitive types, Dict and List."
                f" Argument `{arg_def.arg}` has: {ast.unparse(ann)}"
            )
            return [self._gen_linter_message(desc, arg_def.lineno)]
        container = _name_of(ann.value) or ast.unparse(ann.value)
        if container not in ("Dict", "dict", "List", "list"):
            desc = (
                f"`{function_name}` allows only Dict, List as complex types."
                f"Argument `{arg_def.arg}` has: {container}"
            )
            return [self._gen_linter_message(desc, arg_def.lineno)]
        is_dict = container in ("Dict", "dict")
        elts = ann.slice.elts if is_dict and isinstance(ann.slice, ast.Tuple) else [ann.slice]
        desc = f"{'Dict' if is_dict else 'List'} can only have primitive types"
        # one message per key or value type that is not a plain name
        return [
            self._gen_linter_message(desc, arg_def.lineno)
            for el in elts
            if not isinstance(el, ast.Name)
        ]


class TorchxReturnValidator(TorchxFunctionValidator):
    """The function is annotated to return ``AppDef`` (or ``specs.AppDef``)."""

    def __init__(self, supported_return_type: str = "AppDef") -> None:
        self._supported_return_type = supported_return_type

    def _get_return_annotation(self, app_specs_func_def: ast.FunctionDef) -> Optional[str]:
        ret = app_specs_func_def.returns
        if isinstance(ret, ast.Constant) and isinstance(ret.value, str):
            return ret.value.rpartition(".")[2]  # "specs.AppDef" -> "AppDef"
        return _name_of(ret) if ret else None

    def validate(self, app_specs_func_def: ast.FunctionDef) -> List[LinterMessage]:
        supported = self._supported_return_type
        ret = self._get_return_annotation(app_specs_func_def)
        name = app_specs_func_def.name
        if not ret:
            desc = (
                f"Function: {name} missing return annotation "
                f"or has unknown annotations. Supported return annotation: {supported}"
            )
        elif ret != supported:
            desc = (
                f"Function: {name} has incorrect return annotation, "
                f"supported annotation: {supported}"
            )
        else:
            return []
        return [self._gen_linter_message(desc, app_specs_func_def.lineno)]


class TorchFunctionVisitor(ast.NodeVisitor):
    """Finds the component function by name and runs the validators on it."""

    def __init__(
        self,
        component_function_name: str,
        validators: Optional[List[TorchxFunctionValidator]] = None,
    ) -> None:
        self.validators: List[TorchxFunctionValidator] = (
            validators
            if validators is not None
            else [TorchxFunctionArgsValidator(), TorchxReturnValidator()]
        )
        self.linter_errors: List[LinterMessage] = []
        self.component_function_name = component_function_name
        self.visited_function = False

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name != self.component_function_name:
            return
        self.visited_function = True
        for validator in self.validators:
            self.linter_errors += validator.validate(node)


# upstream's later names for the same classes
ComponentFunctionValidator = TorchxFunctionValidator
ArgTypeValidator = TorchxFunctionArgsValidator
ReturnTypeValidator = TorchxReturnValidator
ComponentFnVisitor = TorchFunctionVisitor


@functools.lru_cache(maxsize=64)
def _parse_text(path: str, text: str) -> ast.Module:
    return cast(ast.Module, parse_source(text, filename=path))


def _parse(path: str) -> ast.Module:
    """The file's AST, read through ``read_conf_file`` (upstream's hook for files kept
    elsewhere); cached by content, so an unchanged file is parsed once."""
    return _parse_text(os.path.abspath(path), read_conf_file(path))


def validate(
    path: str, component_function: str, validators: Optional[List[TorchxFunctionValidator]] = None
) -> List[LinterMessage]:
    """Lint ``component_function`` in the Python file ``path``; an empty list means it is fine."""
    try:
        module = _parse(path)
    except SyntaxError as ex:
        return [LinterMessage("TorchXValidator", ex.msg, ex.lineno or 0, ex.offset or 0)]
    except UnicodeDecodeError as ex:
        return [LinterMessage("TorchXValidator", f"{path} is not a text file: {ex.reason}", 0, 0)]
    visitor = TorchFunctionVisitor(component_function, validators)
    visitor.visit(module)
    errors = visitor.linter_errors
    if not visitor.visited_function:
        errors.append(
            LinterMessage("TorchXValidator", f"Function {component_function} not found", 0, 0)
        )
    return errors
