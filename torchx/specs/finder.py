"""Find components: builtins, the ``torchx.components`` entry points, and ``file.py:fn``."""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional

from torchx.specs.api import AppDef, TorchXError

BUILTIN_PACKAGE = "torchx.components"
_NOT_COMPONENT_MODULES = {"component_test_base", "structured_arg"}


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


def _returns_appdef(fn: Any) -> bool:
    ann = inspect.signature(fn).return_annotation
    return ann in (AppDef, "AppDef", "specs.AppDef") or (
        isinstance(ann, str) and ann.endswith("AppDef")
    )


def _components_of_module(module: ModuleType, prefix: str) -> Dict[str, _Component]:
    found: Dict[str, _Component] = {}
    for fn_name, fn in inspect.getmembers(module, inspect.isfunction):
        if fn.__module__ != module.__name__ or fn_name.startswith("_") or not _returns_appdef(fn):
            continue
        name = f"{prefix}.{fn_name}" if prefix else fn_name
        doc = inspect.getdoc(fn) or ""
        found[name] = _Component(name, doc.split("\n")[0], fn_name, fn, [])
    return found


def _walk(package: str, prefix: str) -> Dict[str, _Component]:
    found: Dict[str, _Component] = {}
    root = importlib.import_module(package)
    found.update(_components_of_module(root, prefix))
    if not hasattr(root, "__path__"):
        return found
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        short = info.name[len(package) + 1 :]
        if short.split(".")[-1] in _NOT_COMPONENT_MODULES or short.startswith("_"):
            continue
        module = importlib.import_module(info.name)
        sub_prefix = ".".join(p for p in (prefix, short) if p)
        found.update(_components_of_module(module, sub_prefix))
    return found


_cache: Optional[Dict[str, _Component]] = None


def get_components() -> Dict[str, _Component]:
    """Builtins plus entry-point components (added, never replacing), cached per process."""
    global _cache
    if _cache is None:
        from torchx.util.entrypoints import entry_point_names, load_group

        components: Dict[str, _Component] = {}
        if entry_point_names("torchx.components"):
            for alias, loader in load_group("torchx.components").items():
                module = loader()
                prefix = "" if alias.startswith("_") else alias
                if isinstance(module, ModuleType):
                    if hasattr(module, "__path__"):
                        components.update(_walk(module.__name__, prefix))
                    else:
                        components.update(_components_of_module(module, prefix))
        components.update(_walk(BUILTIN_PACKAGE, ""))  # a plugin never hides a builtin
        _cache = components
    return _cache


def _builtin_component(name: str) -> Optional[_Component]:
    """``group.fn`` from ``torchx.components.group`` without scanning anything else."""
    module_name, _, fn_name = name.rpartition(".")
    if not module_name or module_name.split(".")[-1] in _NOT_COMPONENT_MODULES:
        return None
    try:
        module = importlib.import_module(f"{BUILTIN_PACKAGE}.{module_name}")
    except ImportError:
        return None
    return _components_of_module(module, module_name).get(name)


def _load_file_component(path: str, fn_name: str) -> _Component:
    if not os.path.isfile(path):
        raise ComponentNotFoundException(f"component file {path!r} does not exist")
    with open(path) as f:
        source = f.read()
    namespace: Dict[str, Any] = {
        "__file__": os.path.abspath(path),
        "__name__": "__torchx_component__",
    }
    try:
        exec(compile(source, path, "exec"), namespace)
    except Exception as e:
        raise ComponentValidationException(
            f"{path}: failed to load: {type(e).__name__}: {e}"
        ) from None
    fn = namespace.get(fn_name)
    if not callable(fn):
        funcs = [k for k, v in namespace.items() if inspect.isfunction(v) and not k.startswith("_")]
        hint = difflib.get_close_matches(fn_name, funcs, n=3)
        more = (
            f"; did you mean {', '.join(hint)}?"
            if hint
            else f"; functions in it: {', '.join(funcs) or 'none'}"
        )
        raise ComponentNotFoundException(f"{path} has no function {fn_name!r}{more}")
    doc = inspect.getdoc(fn) or ""
    return _Component(f"{path}:{fn_name}", doc.split("\n")[0], fn_name, fn, [])


def _validate(component: _Component, where: str) -> None:
    from torchx.specs.builders import ComponentArgumentError, validate_component_fn

    try:
        validate_component_fn(component.fn, where)
    except ComponentArgumentError as e:
        raise ComponentValidationException(str(e)) from None


def get_component(name: str) -> _Component:
    """A component by builtin/plugin name (``dist.ddp``) or ``path/to/file.py:fn``."""
    if ":" in name:
        path, _, fn_name = name.rpartition(":")
        component = _load_file_component(path, fn_name)
        _validate(component, name)
        return component
    builtin = _builtin_component(name)
    if builtin is not None:  # builtins are never hidden by plugins: no entry-point scan needed
        _validate(builtin, name)
        return builtin
    components = get_components()
    if name not in components:
        close = difflib.get_close_matches(name, list(components), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ComponentNotFoundException(
            f"unknown component {name!r}{hint} (`torchx builtins` lists them;"
            " a file component is path/to/file.py:function)"
        )
    component = components[name]
    _validate(component, name)
    return component


def get_builtin_source(name: str) -> str:
    """The source code of a builtin component (``torchx builtins --print``)."""
    return inspect.getsource(get_component(name).fn)
