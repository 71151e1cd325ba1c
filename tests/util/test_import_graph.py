"""The import graph of ``torchx`` has no circle, the helpers below ``specs`` know no
data model, and the ``local_cwd`` supervisor's imports are stdlib only.

A static check (``ast``, nothing is imported): every ``import``/``from ... import`` in
every module counts, also the ones inside functions (a deferred import is still a
dependency, and a circle through one breaks as soon as someone moves it to the top);
only ``if TYPE_CHECKING:`` blocks are left out (annotations, no run-time edge).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[2] / "torchx"
# modules below the data model: they may import only each other (and libraries); the
# root package holds only the version and the default image
BELOW_SPECS = ("torchx.util.", "torchx.version")
ROOT_PACKAGE = "torchx"
# the local supervisor runs under a bare ``python -S -E``: it may import only these
SUPERVISOR = "torchx.schedulers.local.supervisor"
SUPERVISOR_CLOSURE = {
    "torchx",
    "torchx.runtime",
    "torchx.runtime.watchdog",  # its stall clock, shared with every scheduler's watchdog
    "torchx.schedulers",
    "torchx.schedulers.local",
    "torchx.schedulers.local.failures",
    "torchx.schedulers.local.logs",
    "torchx.schedulers.local.processes",
    "torchx.schedulers.local.protocol",
    SUPERVISOR,
}

# Import edges that close a known circle; the test fails if one of them disappears, so the
# list cannot outlive its circle. None left since the tracker agent was removed.
KNOWN_CIRCLE_EDGES: Set[Tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.stmt]:
    """Import statements anywhere in ``tree`` except under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(child)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def _resolve(name: str, modules: Dict[str, Path]) -> Optional[str]:
    """The longest prefix of ``name`` that is a torchx module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph() -> Dict[str, Set[str]]:
    """``{module: modules it imports}`` over the torchx package (absolute names)."""
    modules = _modules()
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] or [base]
            for t in targets:
                found = _resolve(t, modules)
                if found and found != mod:
                    graph[mod].add(found)
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import circle (``[a, b, ..., a]``), or None."""
    state: Dict[str, int] = {}  # 1: on the stack, 2: done
    stack: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _below_specs(mod: str) -> bool:
    return mod == ROOT_PACKAGE or mod.startswith(BELOW_SPECS)


def test_no_import_circle_among_torchx_modules() -> None:
    graph = import_graph()
    for a, b in KNOWN_CIRCLE_EDGES:
        assert b in graph[a], f"{a} no longer imports {b}: drop it from KNOWN_CIRCLE_EDGES"
        graph[a].discard(b)
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_helpers_below_specs_import_only_each_other() -> None:
    bad = {
        mod: sorted(t for t in targets if not _below_specs(t))
        for mod, targets in import_graph().items()
        if _below_specs(mod)
    }
    bad = {m: t for m, t in bad.items() if t}
    assert not bad, f"helpers below specs import the layers above: {bad}"


def _packages_of(mod: str) -> Set[str]:
    """The packages Python imports before ``mod`` (``a.b.c``: ``a``, ``a.b``)."""
    parts = mod.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _import_time_edges(mod: str) -> Set[str]:
    """What importing ``mod`` imports: its imports outside functions (for the packages
    the supervisor passes through, whose functions it never calls)."""
    modules = _modules()
    tree = ast.parse(modules[mod].read_text())
    found: Set[str] = set()
    for node in _imports(tree):
        if any(
            isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(n is node for n in ast.walk(f))
            for f in ast.walk(tree)
        ):
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        found |= {m for m in (_resolve(n or "", modules) for n in names) if m and m != mod}
    return found


def test_the_local_supervisor_imports_only_its_stdlib_siblings() -> None:
    """Every import of the supervisor's own package counts (its functions run); of the
    packages above it, what they import when imported."""
    graph = import_graph()
    seen: Set[str] = set()
    todo = [SUPERVISOR]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        inside = mod.startswith("torchx.schedulers.local.")
        todo.extend((graph[mod] if inside else _import_time_edges(mod)) | _packages_of(mod))
    assert seen == SUPERVISOR_CLOSURE


def test_the_local_supervisor_starts_without_site_packages(tmp_path: Path) -> None:
    """The real start: its command line, in a bare interpreter (``-S -E`` on Linux)."""
    from torchx.schedulers.local.supervisor import BOOT, command

    argv = command(str(tmp_path / "no-such-app"))
    probe = BOOT.replace(
        "sys.exit(main())",
        "print(sorted(m for m in sys.modules if m.startswith('torchx')))",
    )
    argv[argv.index(BOOT)] = probe
    out = subprocess.run(argv[:-1], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert set(ast.literal_eval(out.stdout)) == SUPERVISOR_CLOSURE


def _bound_names(tree: ast.Module) -> Set[str]:
    """Names a module binds when it is imported (top level, also under ``if``/``try``)."""
    names: Set[str] = set()
    todo: List[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If) and not _is_type_checking(node.test):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            for h in node.handlers:
                todo += h.body
    return names


def test_no_torchx_import_goes_through_a_lazy_module_getattr() -> None:
    """``from torchx.x import name`` finds ``name`` bound in ``torchx.x`` (or a submodule),
    never only through its module ``__getattr__``: that import, run while another thread
    imports the same modules, deadlocks into "partially initialized module" (seen in
    Airflow's triggerer, whose trigger and log threads import ``torchx.runner`` at once)."""
    modules = _modules()
    bound = {m: _bound_names(ast.parse(p.read_text(), str(p))) for m, p in modules.items()}
    bad = []
    for mod, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in modules:
                continue
            for alias in node.names:
                name = alias.name
                if name != "*" and name not in bound[node.module]:
                    if f"{node.module}.{name}" not in modules:
                        bad.append(f"{mod}: from {node.module} import {name}")
    assert not bad, bad


def test_the_trackers_package_names_modules_the_runner_imports() -> None:
    """``torchx.trackers``' docstring says which modules every submit loads: each module it
    names exists, and ``torchx.runner.api`` imports it (directly or through others)."""
    modules = _modules()
    doc = ast.get_docstring(ast.parse(modules["torchx.trackers"].read_text())) or ""
    named = re.findall(r"``(torchx(?:\.\w+)+)``", doc)
    assert named
    assert [m for m in named if m not in modules] == []
    graph, seen, todo = import_graph(), set(), ["torchx.runner.api"]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo += graph[mod]
    assert [m for m in named if m not in seen] == []


def test_the_check_sees_a_circle_and_a_deferred_import() -> None:
    """The checker itself: a circle through an import inside a function is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    tree = ast.parse("import x\nif TYPE_CHECKING:\n    import y\ndef f():\n    from z import w\n")
    names = [n.names[0].name if isinstance(n, ast.Import) else n.module for n in _imports(tree)]
    assert names == ["x", "z"]


def test_a_runner_loads_the_tracker_api_only_when_a_tracker_is_used() -> None:
    """``torchx.runner.api`` loads ``torchx.trackers.env`` alone; ``torchx.trackers.api``
    (backends, dataclasses, protocols) waits for the first tracker."""
    code = "import sys, torchx.runner.api; print('torchx.trackers.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
