"""Find components: builtins, the ``torchx.components`` entry points, ``file.py:fn`` and
``package.module:fn``, each checked by the linter before it is used.

Unlike upstream, entry-point components add to the builtins instead of replacing them,
and a file component runs in its own namespace.
"""

from __future__ import annotations

import abc
import functools
import importlib
import inspect
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from torchx.specs.api import AppDef, TorchXError
from torchx.specs.file_linter import get_fn_docstring, validate
from torchx.util.io import read_conf_file

BUILTIN_PACKAGE = "torchx.components"


logger: logging.Logger = logging.getLogger(__name__)


class ComponentNotFoundException(TorchXError):
    """No component by that name (or no such file / function)."""


class ComponentValidationException(TorchXError):
    """A component function breaks the component rules (named in the message)."""


@dataclass
class _Component:
    name: str
    description: str
    fn_name: str
    fn: Callable[..., AppDef]
    validation_errors: List[str]


def _short_description(fn: Callable[..., Any]) -> str:
    """The first line of the docstring: enough for listings, without docstring_parser."""
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n")[0] if doc else fn.__name__


def _lint(path: str, fn_name: str) -> List[str]:
    return [m.description for m in validate(path, fn_name)]


class ComponentsFinder(abc.ABC):
    @abc.abstractmethod
    def find(self) -> List[_Component]:
        """The components this finder knows (each with its linter errors, if any)."""


def is_namespace_package(module: ModuleType) -> bool:
    """Whether ``module`` is a namespace package (a package without ``__init__.py``)."""
    return getattr(module, "__file__", None) is None


def is_package(module: ModuleType) -> bool:
    """Whether ``module`` is a package, regular or namespace (it has ``__path__``)."""
    return hasattr(module, "__path__")


def module_relname(module: ModuleType, relative_to: ModuleType) -> str:
    """``module``'s dotted name relative to ``relative_to`` (``""`` for the module itself)."""
    name, base = module.__name__, relative_to.__name__
    if name == base:
        return ""
    if not name.startswith(base + "."):
        raise ValueError(f"`{name}` is not a submodule of `{base}`")
    return name[len(base) + 1 :]


class ModuleComponentsFinder(ComponentsFinder):
    """The functions of ``module`` and its submodules, named ``{group}.{relative module}.{fn}``:
    ``echo`` of ``foo/bar/baz.py`` is ``abc.baz.echo`` for module ``foo.bar``, group ``abc``."""

    def __init__(self, module: Union[str, ModuleType], group: str) -> None:
        self.base_module: ModuleType = self._try_import(module)
        self.group = group

    @staticmethod
    def _try_import(module: Union[str, ModuleType]) -> ModuleType:
        return importlib.import_module(module) if isinstance(module, str) else module

    def _iter_modules_recursive(self, module: Union[str, ModuleType]) -> Iterator[ModuleType]:
        module = self._try_import(module)
        if not is_namespace_package(module):
            yield module
        if is_package(module):
            import pkgutil  # listing a package only (pkgutil loads importlib.util)

            for info in pkgutil.iter_modules(module.__path__, prefix=f"{module.__name__}."):
                if info.ispkg:
                    yield from self._iter_modules_recursive(info.name)
                else:
                    yield self._try_import(info.name)

    def find(self) -> List[_Component]:
        found: List[_Component] = []
        for module in self._iter_modules_recursive(self.base_module):
            found += self._get_components_from_module(module)
        return found

    def _get_components_from_module(self, module: ModuleType) -> List[_Component]:
        path = os.path.abspath(module.__file__ or "")
        relname = module_relname(module, relative_to=self.base_module)
        found = []
        for fn_name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__:
                continue  # imported, not defined here
            name = ".".join(p for p in (self.group, relname, fn_name) if p)
            desc = get_fn_docstring(fn)[0]
            found.append(_Component(name, desc, fn_name, fn, _lint(path, fn_name)))
        return found


class CustomComponentsFinder(ComponentsFinder):
    """The component ``function_name`` of the Python file ``filepath`` (``torchx run f.py:fn``)."""

    def __init__(self, filepath: str, function_name: str) -> None:
        self._filepath = filepath
        self._function_name = function_name

    def find(self) -> List[_Component]:
        return [self._find(full_description=True)]

    def _find(self, full_description: bool) -> _Component:
        path, fn_name = self._filepath, self._function_name
        try:
            source = read_conf_file(path)
        except FileNotFoundError:
            raise ComponentNotFoundException(f"component file {path!r} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ComponentValidationException(f"cannot read component file {path}: {e}") from None
        not_found = f"Function {fn_name} not found"
        lint = validate(path, fn_name)
        for m in lint:
            if m.name == "TorchXValidator" and m.description != not_found:  # does not parse
                raise ComponentValidationException(
                    f"{path}:{m.line}: {m.description}; fix the file and rerun"
                )
        errors = [m.description for m in lint]
        namespace: Dict[str, Any] = {
            "__file__": os.path.abspath(path),
            "__name__": "__torchx_component__",
        }
        try:
            exec(compile(source, path, "exec", dont_inherit=True), namespace)
        except Exception as e:  # whatever the user's file raised: one line naming it
            raise ComponentValidationException(
                f"{path}: failed to load: {type(e).__name__}: {e}"
            ) from None
        fn = namespace.get(fn_name)
        if not callable(fn):
            funcs = [k for k, v in namespace.items() if inspect.isfunction(v) and k[:1] != "_"]
            import difflib

            hint = difflib.get_close_matches(fn_name, funcs, n=3)
            more = (
                f"; did you mean {', '.join(hint)}?"
                if hint
                else f"; functions in it: {', '.join(funcs) or 'none'}"
            )
            raise ComponentNotFoundException(f"{path} has no function {fn_name!r}{more}")
        desc = get_fn_docstring(fn)[0] if full_description else _short_description(fn)
        return _Component(f"{path}:{fn_name}", desc, fn_name, fn, errors)


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _is_module_name(where: str) -> bool:
    """``pkg.module`` rather than a file: a dotted name, no ``.py``, no such file here."""
    return (
        bool(_MODULE_NAME.fullmatch(where))
        and not where.endswith(".py")
        and not os.path.exists(where)
    )


def _module_component(module_name: str, fn_name: str) -> _Component:
    """The component ``fn_name`` of an importable module (``examples.components:trainer``):
    a name that holds on any machine where the module is installed, e.g. inside an image."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ComponentNotFoundException(
            f"component module {module_name!r} cannot be imported ({e});"
            " a file component is path/to/file.py:function"
        ) from None
    fn = getattr(module, fn_name, None)
    if not inspect.isfunction(fn):
        raise ComponentNotFoundException(f"module {module_name} has no function {fn_name!r}")
    return _linted(f"{module_name}:{fn_name}", module, fn_name, fn)


def _linted(name: str, module: ModuleType, fn_name: str, fn: Callable[..., AppDef]) -> _Component:
    errors = _lint(os.path.abspath(module.__file__ or ""), fn_name)
    return _Component(name, _short_description(fn), fn_name, fn, errors)


def _raise_if_invalid(component: _Component) -> _Component:
    if component.validation_errors:
        raise ComponentValidationException(
            f"Component {component.name} has validation errors:"
            f" {'; '.join(component.validation_errors)}"
        )
    return component


@functools.cache
def _find_components() -> Dict[str, _Component]:
    """Every function found (valid or not): entry-point modules, then the builtins."""
    from torchx.util.entrypoints import load_group

    found: List[_Component] = []
    for alias, loader in load_group("torchx.components").items():
        module = loader()
        if isinstance(module, ModuleType):
            group = "" if alias.startswith("_") else alias  # "_" means no name prefix
            found += ModuleComponentsFinder(module, group).find()
    found += ModuleComponentsFinder(BUILTIN_PACKAGE, "").find()  # builtins win a clash
    return {c.name: c for c in found}


_load_components = _find_components  # upstream's name (its tests call it)


def get_components() -> Dict[str, _Component]:
    """The valid components by name: the builtins plus the ``torchx.components`` entry points
    (``foo = my.pkg`` names ``my.pkg``'s functions ``foo.<module>.<fn>``; an alias starting
    with ``_`` adds no prefix)."""
    return {n: c for n, c in _find_components().items() if not c.validation_errors}


def _builtin_component(name: str) -> Optional[_Component]:
    """``group.fn`` from ``torchx.components.group`` without scanning anything else."""
    module_name, _, fn_name = name.rpartition(".")
    if not module_name:
        return None
    try:
        module = importlib.import_module(f"{BUILTIN_PACKAGE}.{module_name}")
    except ImportError:
        return None
    fn = getattr(module, fn_name, None)
    if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
        return None
    return _linted(name, module, fn_name, fn)


def get_component(name: str) -> _Component:
    """A component by builtin/plugin name (``dist.ddp``), ``path/to/file.py:fn`` or
    ``package.module:fn`` (a dotted name that is not a file here: imported); raises
    :class:`ComponentNotFoundException` or :class:`ComponentValidationException`."""
    if ":" in name:
        path, _, fn_name = name.rpartition(":")
        if _is_module_name(path):
            return _raise_if_invalid(_module_component(path, fn_name))
        return _raise_if_invalid(CustomComponentsFinder(path, fn_name)._find(False))
    builtin = _builtin_component(name)
    if builtin is not None:  # builtins are never hidden by plugins: no entry-point scan needed
        return _raise_if_invalid(builtin)
    components = _find_components()
    if name not in components:
        valid = list(get_components())
        import difflib

        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ComponentNotFoundException(
            f"unknown component {name!r}{hint} (`torchx builtins` lists them;"
            " a file component is path/to/file.py:function)"
        )
    return _raise_if_invalid(components[name])


def get_builtin_source(name: str) -> str:
    """The component's source under the module's import lines (``torchx builtins --print``)."""
    component = get_component(name)
    lines = Path(inspect.getfile(component.fn)).read_text().splitlines()
    imports = []
    for line in lines:
        if line.startswith(("import ", "from ")):
            imports.append(line)
        elif line.startswith(f"def {component.fn_name}("):
            break
    return "\n".join([*imports, "\n", inspect.getsource(component.fn), "\n"])
