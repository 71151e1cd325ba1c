"""The code-health counts issue 38 sets targets for, measured on ``torchx/``.

Prints, per count, the number and its target, then (with ``--files``) each file's share, and
the lines per package. Lines have no target (issue 54 lifted it: code is split by concept,
never compressed to meet a number). Exits 1 when a count is over its target.

Usage::

    python scripts/code_counts.py [--files] [--root torchx]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

# name: (pattern counted once per matching line, target)
COUNTS: Dict[str, Tuple[re.Pattern[str], int]] = {
    "broad excepts": (re.compile(r"except( +\(?(Exception|BaseException)\b|:)"), 25),
    "type: ignores": (re.compile(r"# type: ignore"), 10),
    # the builtin only (``lazy_getattr(`` is a module-level ``__getattr__`` factory)
    "getattr probes": (re.compile(r"(?<![\w.])getattr\("), 25),
}


def measure(root: Path) -> Dict[str, Dict[str, int]]:
    """Per count, per file (relative to ``root``'s parent), how many; ``lines`` included."""
    found: Dict[str, Dict[str, int]] = {"lines": {}, **{name: {} for name in COUNTS}}
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root.parent))
        text = path.read_text().splitlines()
        found["lines"][name] = len(text)
        for count, (pattern, _) in COUNTS.items():
            hits = sum(1 for line in text if pattern.search(line))
            if hits:
                found[count][name] = hits
    return found


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "torchx"))
    parser.add_argument("--files", action="store_true", help="list each file's share")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"error: {root} is not a directory; pass --root <path to torchx/>", file=sys.stderr)
        return 2
    found = measure(root)
    over = False
    for count, per_file in found.items():
        total = sum(per_file.values())
        if count == "lines":
            print(f"{count:15} {total:6}")
        else:
            target = COUNTS[count][1]
            over = over or total > target
            print(f"{count:15} {total:6}  target {target:6}  {'ok' if total <= target else 'OVER'}")
        if args.files:  # lines: the 20 largest files
            ranked = sorted(per_file.items(), key=lambda kv: -kv[1])
            for name, hits in ranked[:20] if count == "lines" else ranked:
                print(f"    {hits:4}  {name}")
    packages: Dict[str, int] = {}
    for name, n in found["lines"].items():  # torchx/<package>/... (a top module: itself)
        package = "/".join(Path(name).parts[:2])
        packages[package] = packages.get(package, 0) + n
    print("lines per package:")
    for package, n in sorted(packages.items(), key=lambda kv: -kv[1]):
        print(f"    {n:6}  {package}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
