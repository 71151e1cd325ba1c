"""How much of upstream TorchX's public surface imports from this package, by upstream path.

Reads upstream's source (a checkout dir holding ``torchx/``; nothing of it is imported or
copied): for each public module, its public module-level names (functions, classes,
assignments but type variables, ``__all__``, and for a package ``__init__`` the names it
re-exports from torchx), and the public members of its classes (methods and class-body
attributes, enum members, dataclass fields). Then it imports the same module path from this
package and checks each name (``getattr``; a dataclass field counts if it is a field).

Usage::

    python scripts/upstream_names.py --upstream /tmp/upstream-src [--missing]

Modules upstream ships that this package does not claim (see ``EXCLUDED``) are listed
with the reason and not counted.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Dict, List, Tuple

# upstream modules outside the drop-in surface, with why
EXCLUDED: Dict[str, str] = {
    "torchx.cli": "the CLI's internals (verbs are covered by CLI tests, not imports)",
    "torchx.apps": "programs the builtins run, not an import API",
    "torchx.examples": "upstream's examples",
    "torchx.notebook": "IPython magic, not carried over",
    "torchx.pipelines.kfp": "upstream's KFP v1 adapter (retired upstream; ours is KFP v2)",
    "torchx.components.component_test_base": "upstream's test helper",
    "torchx.components.integration_tests": "upstream's test helpers",
    "torchx.components.serve": "TorchServe component, not carried over",
    "torchx.components.metrics": "TensorBoard component, not carried over",
    "torchx.components.interpret": "Captum component, not carried over",
    "torchx.components.train": "Lightning example component, not carried over",
    "torchx.schedulers.docker_scheduler": "no docker scheduler (no Docker engine target)",
    "torchx.schedulers.lsf_scheduler": "scheduler not carried over",
    "torchx.schedulers.gcp_batch_scheduler": "scheduler not carried over",
    "torchx.schedulers.aws_sagemaker_scheduler": "scheduler not carried over",
    "torchx.schedulers.kubernetes_mcad_scheduler": "scheduler not carried over",
    "torchx.schedulers.ray": "upstream's Ray driver package (ours: schedulers/ray_driver.py)",
}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _public(name: str) -> bool:
    return not name.startswith("_")


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
            isinstance(target, ast.Attribute) and target.attr == "dataclass"
        ):
            return True
    return False


def _class_members(node: ast.ClassDef) -> List[str]:
    """Members that exist at run time: methods, assigned attributes, dataclass fields (an
    annotation alone, e.g. a TypedDict key, is no attribute upstream either)."""
    members: List[str] = []
    fields = _is_dataclass(node)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members.append(item.name)
        elif isinstance(item, ast.Assign):
            members += [t.id for t in item.targets if isinstance(t, ast.Name)]
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if fields or item.value is not None:
                members.append(item.target.id)
    return [m for m in members if _public(m)]


def _is_typevar(value: ast.expr) -> bool:
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("TypeVar", "ParamSpec")
    )


def surface(path: Path, is_package: bool) -> List[str]:
    """Public names of one upstream module, ``Class.member`` for class members."""
    tree = ast.parse(path.read_text(), str(path))
    names: List[str] = []
    exported: List[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names.append(node.name)
            if _public(node.name):
                names += [f"{node.name}.{m}" for m in _class_members(node)]
        elif isinstance(node, ast.Assign) and not _is_typevar(node.value):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    if t.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                        exported = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                    else:
                        names.append(t.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif (
            is_package
            and isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("torchx")
        ):
            names += [a.asname or a.name for a in node.names if a.name != "*"]
    out = [n for n in names if _public(n.split(".")[0])]
    out += [n for n in exported if n not in out]
    return sorted(set(out))


def _has(obj: object, name: str) -> bool:
    for part in name.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif dataclasses.is_dataclass(obj) and part in {
            f.name
            for f in dataclasses.fields(obj)  # type: ignore[arg-type]
        }:
            return True
        else:
            return False
    return True


def measure(upstream: Path) -> Tuple[Dict[str, Tuple[int, List[str]]], Dict[str, str]]:
    root = upstream / "torchx"
    per_module: Dict[str, Tuple[int, List[str]]] = {}
    excluded: Dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "test" in rel.parts or path.name.endswith("_test.py"):
            continue
        mod = _module_name(upstream, path)
        reason = next((r for m, r in EXCLUDED.items() if mod == m or mod.startswith(m + ".")), None)
        if reason:
            excluded[mod] = reason
            continue
        names = surface(path, path.name == "__init__.py")
        try:
            ours = importlib.import_module(mod)
        except ImportError as e:
            per_module[mod] = (len(names), [f"(module: {e})"] + names)
            continue
        per_module[mod] = (len(names), [n for n in names if not _has(ours, n)])
    return per_module, excluded


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--upstream", required=True, help="dir holding upstream's torchx/ package")
    ap.add_argument("--missing", action="store_true", help="list every missing name")
    args = ap.parse_args()
    per_module, excluded = measure(Path(args.upstream))
    total = sum(n for n, _ in per_module.values())
    missing = sum(
        len([m for m in miss if not m.startswith("(module")]) for _, miss in per_module.values()
    )
    for mod, (n, miss) in sorted(per_module.items()):
        names = [m for m in miss if not m.startswith("(module")]
        if miss:
            line = f"{mod}: {n - len(names)}/{n}"
            print(line + (f"  missing: {', '.join(miss)}" if args.missing else ""))
    print(f"excluded modules ({len(excluded)}): " + ", ".join(sorted(excluded)))
    print(
        f"surface: {total - missing} of {total} names import"
        f" ({100 * (total - missing) / total:.1f}%) over {len(per_module)} modules"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
