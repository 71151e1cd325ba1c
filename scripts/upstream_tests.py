"""Run upstream TorchX's own tests against THIS package, one file at a time.

Why: "drop-in" is measured by the tests upstream wrote for its public behaviour. This
script fetches nothing and copies nothing into the repository: it takes a checkout of
upstream (a directory holding upstream's ``torchx/`` package, e.g. from
``git -C <mirror> archive v0.7.0 torchx | tar -x -C DIR``), puts only upstream's test
directories and test-support modules in a temporary overlay, and runs pytest there with
this repository's ``torchx`` first on the path. The overlay is appended to the
``__path__`` of our packages, so ``torchx.test.fixtures`` or
``torchx.specs.test.components`` resolve to upstream's test support while every
non-test module is ours (an upstream module we lack stays missing).

Usage::

    python scripts/upstream_tests.py --upstream /tmp/upstream-src [--junit-dir DIR] [FILE ...]
    # the baseline: upstream's tests on upstream 0.7.0 itself (a venv with torchx==0.7.0)
    python scripts/upstream_tests.py --upstream /tmp/upstream-src --installed \
        --python benchmarks/.venvs/upstream/bin/python

FILE is relative to upstream's ``torchx/`` (default: the ten files of issue 26).
Prints passed/failed/error counts per file and the total.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent

FILES = [
    "specs/test/api_test.py",
    "specs/test/builders_test.py",
    "specs/test/file_linter_test.py",
    "specs/test/finder_test.py",
    "components/test/dist_test.py",
    "components/test/utils_test.py",
    "runner/test/api_test.py",
    "runner/test/config_test.py",
    "schedulers/test/api_test.py",
    "schedulers/test/local_scheduler_test.py",
]

# Upstream's test-support modules and fixture dirs (the test files run are added). Only
# these: the component finder imports every module under torchx.components, so a test
# file of a component we do not ship (metrics_test) would break every finder test.
SUPPORT = [
    "test/__init__.py",
    "test/fixtures.py",
    "specs/test/__init__.py",
    "specs/test/components",
    "components/test/__init__.py",
    "components/component_test_base.py",
    "runner/test/__init__.py",
    "runner/test/resource",
    "schedulers/test/__init__.py",
    "schedulers/test/test_util.py",
    "util/test/__init__.py",
    "util/test/entrypoints_test.py",
]

CONFTEST = '''
"""Make upstream's test support importable under our torchx packages (overlay only)."""
import importlib
import os

_OVERLAY = os.path.join(os.path.dirname(__file__), "overlay", "torchx")
for _pkg in ("", "specs", "components", "runner", "schedulers", "util"):
    _mod = importlib.import_module("torchx" + ("." + _pkg if _pkg else ""))
    _dir = os.path.join(_OVERLAY, _pkg) if _pkg else _OVERLAY
    if _dir not in _mod.__path__:
        _mod.__path__.append(_dir)
'''


def make_overlay(upstream: Path, work: Path, files: List[str]) -> None:
    """Copy upstream's test support and the test ``files`` (only) into ``work/overlay``."""
    src = upstream / "torchx"
    if not (src / "specs").is_dir():
        raise SystemExit(f"{upstream}: no torchx/ package here (give upstream's checkout dir)")
    dst = work / "overlay" / "torchx"
    for rel in SUPPORT + files:
        s, d = src / rel, dst / rel
        if s.is_dir():
            shutil.copytree(s, d)
        elif s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)
    # Package markers, so pytest imports a test file under its upstream name
    # (torchx.specs.test.finder_test, which upstream's entry-point tests name); our
    # packages are imported first (conftest), so these empty files never run.
    for pkg in ("", "specs", "components", "runner", "schedulers", "util"):
        (dst / pkg / "__init__.py").touch()
    (work / "conftest.py").write_text(CONFTEST)


def counts(junit: Path) -> Tuple[int, int, int, int]:
    """(passed, failed, errors, skipped) from a junit xml file."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    p = f = e = s = 0
    for suite in suites:
        for case in suite.iter("testcase"):
            tags = {child.tag for child in case}
            if "failure" in tags:
                f += 1
            elif "error" in tags:
                e += 1
            elif "skipped" in tags:
                s += 1
            else:
                p += 1
    return p, f, e, s


def run_file(
    work: Path, rel: str, junit_dir: Path, extra: List[str], python: str, ours: bool
) -> Tuple[int, ...]:
    junit = junit_dir / (rel.replace("/", "__") + ".xml")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if ours:
        env["PYTHONPATH"] = str(ROOT)
    env.setdefault("TORCHX_HOME", str(work / "torchx_home"))
    cmd = [
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--rootdir={work}",
        f"--junitxml={junit}",
        str(work / "overlay" / "torchx" / rel),
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    tail = "\n".join(proc.stdout.strip().splitlines()[-1:])
    if not junit.exists():
        print(f"{rel}: pytest wrote no report\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return (0, 0, 1, 0)
    c = counts(junit)
    print(f"{rel}: passed {c[0]} failed {c[1]} errors {c[2]} skipped {c[3]}  ({tail})")
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--upstream", required=True, help="dir holding upstream's torchx/ package")
    ap.add_argument("--junit-dir", help="keep the per-file junit xml here")
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter to run pytest with (it needs pytest and torch)",
    )
    ap.add_argument(
        "--installed",
        action="store_true",
        help="test the torchx installed in --python's env (e.g. upstream 0.7.0 itself, for"
        " the tests upstream passes) instead of this repository's",
    )
    ap.add_argument("files", nargs="*", default=FILES)
    args, extra = ap.parse_known_args()
    python = os.path.abspath(args.python)  # pytest runs in a temp dir; keep the venv path
    with tempfile.TemporaryDirectory(prefix="torchx-upstream-tests-") as tmp:
        work = Path(tmp)
        make_overlay(Path(args.upstream), work, args.files)
        junit_dir = Path(args.junit_dir) if args.junit_dir else work / "junit"
        junit_dir.mkdir(parents=True, exist_ok=True)
        total: Dict[str, int] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
        for rel in args.files:
            c = run_file(work, rel, junit_dir, extra, python, not args.installed)
            for k, v in zip(total, c, strict=True):
                total[k] += v
        print("total: " + " ".join(f"{k} {v}" for k, v in total.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
