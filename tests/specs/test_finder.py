"""Component discovery: upstream's finders, the linter run on every component, clear errors."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

import torchx.components as components
import torchx.components.dist as dist
from torchx.specs.finder import (
    ComponentNotFoundException,
    ComponentValidationException,
    CustomComponentsFinder,
    ModuleComponentsFinder,
    get_builtin_source,
    get_component,
    get_components,
    is_namespace_package,
    is_package,
    module_relname,
    read_conf_file,
)

COMP = (
    "import torchx.specs as specs\n"
    "def good(msg: str = 'hi') -> specs.AppDef:\n"
    "    '''Says hi.\n\n    A second paragraph.\n    '''\n"
    "    return specs.AppDef('g', [specs.Role('g', 'i', entrypoint='echo', args=[msg])])\n"
    "def untyped(msg) -> specs.AppDef:\n    return specs.AppDef('u')\n"
    "def helper(x: int) -> int:\n    return x\n"
)


@pytest.fixture
def pkg(tmp_path: Path) -> Iterator[str]:
    """A package ``fpkg`` with ``fpkg/sub/mod.py`` holding components."""
    root = tmp_path / "fpkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "mod.py").write_text(COMP)
    sys.path.insert(0, str(tmp_path))
    try:
        yield "fpkg"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] == "fpkg"]:
            del sys.modules[name]


def test_module_finder_names_and_lints_every_function(pkg: str) -> None:
    found = {c.name: c for c in ModuleComponentsFinder(pkg, "").find()}
    assert set(found) == {"sub.mod.good", "sub.mod.untyped", "sub.mod.helper"}
    assert found["sub.mod.good"].validation_errors == []
    assert found["sub.mod.good"].description == "Says hi.\nA second paragraph."
    assert found["sub.mod.untyped"].validation_errors == ["Arg msg missing type annotation"]
    assert found["sub.mod.helper"].validation_errors == [
        "Function: helper has incorrect return annotation, supported annotation: AppDef"
    ]
    grouped = {c.name for c in ModuleComponentsFinder(f"{pkg}.sub.mod", "my").find()}
    assert grouped == {"my.good", "my.untyped", "my.helper"}


def test_custom_finder_and_file_components(tmp_path: Path) -> None:
    path = tmp_path / "comp.py"
    path.write_text(COMP)
    [c] = CustomComponentsFinder(str(path), "good").find()
    assert c.name == f"{path}:good" and c.fn_name == "good" and c.validation_errors == []
    assert get_component(f"{path}:good").fn().roles[0].args == ["hi"]
    with pytest.raises(ComponentValidationException) as e:
        get_component(f"{path}:untyped")
    assert str(e.value) == (
        f"Component {path}:untyped has validation errors: Arg msg missing type annotation"
    )
    with pytest.raises(
        ComponentNotFoundException, match="has no function 'goo'; did you mean good"
    ):
        get_component(f"{path}:goo")
    with pytest.raises(ComponentNotFoundException, match="does not exist"):
        get_component(f"{tmp_path}/missing.py:good")


def test_module_path_components_are_imported(pkg: str) -> None:
    # a name that holds wherever the package is installed (a KFP step's image), no file path
    c = get_component(f"{pkg}.sub.mod:good")
    assert (c.name, c.validation_errors) == ("fpkg.sub.mod:good", [])
    assert c.fn().roles[0].args == ["hi"]
    with pytest.raises(ComponentValidationException, match="Arg msg missing type annotation"):
        get_component(f"{pkg}.sub.mod:untyped")
    with pytest.raises(ComponentNotFoundException, match="module fpkg.sub.mod has no function"):
        get_component(f"{pkg}.sub.mod:nope")
    with pytest.raises(ComponentNotFoundException, match="'fpkg.nomod' cannot be imported"):
        get_component(f"{pkg}.nomod:good")


def test_a_broken_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def comp(:\n")
    with pytest.raises(ComponentValidationException, match=r"bad.py:1: invalid syntax"):
        get_component(f"{bad}:comp")
    raising = tmp_path / "raising.py"
    raising.write_text("import torchx.specs as specs\nraise RuntimeError('at import')\n")
    with pytest.raises(ComponentValidationException, match="RuntimeError: at import"):
        get_component(f"{raising}:comp")
    binary = tmp_path / "bin.py"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ComponentValidationException, match="bin.py") as e:
        get_component(f"{binary}:comp")
    assert "\n" not in str(e.value)


def test_builtins_are_found_and_helpers_are_not_components() -> None:
    names = set(get_components())
    assert {"dist.ddp", "dist.spmd", "utils.echo", "utils.booth", "utils.touch"} <= names
    assert "dist.parse_nnodes" not in names and "dist.get_role_name" not in names
    with pytest.raises(
        ComponentValidationException, match="parse_nnodes missing return annotation"
    ):
        get_component("dist.parse_nnodes")
    with pytest.raises(ComponentNotFoundException, match="did you mean utils.echo"):
        get_component("utils.eco")


def test_builtin_source_carries_the_imports() -> None:
    source = get_builtin_source("utils.echo")
    assert source.index("import torchx.specs as specs") < source.index("def echo(")
    assert "def sh(" not in source


def test_module_helpers() -> None:
    assert module_relname(dist, relative_to=components) == "dist"
    assert module_relname(dist, relative_to=dist) == ""
    with pytest.raises(ValueError, match="is not a submodule"):
        module_relname(components, relative_to=dist)
    assert is_package(components) and not is_package(dist)
    namespace = ModuleType("ns")
    namespace.__path__ = []  # type: ignore[attr-defined]
    namespace.__file__ = None
    assert is_namespace_package(namespace) and not is_namespace_package(components)


def test_read_conf_file(tmp_path: Path) -> None:
    f = tmp_path / "x.txt"
    f.write_text("hello")
    assert read_conf_file(str(f)) == "hello"
    assert "def ddp(" in read_conf_file("torchx/components/dist.py")  # bundled with torchx
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_conf_file(str(tmp_path / "nope.txt"))
