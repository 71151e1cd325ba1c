"""Compile a KFP pipeline function to IR YAML:
``python -m torchx.pipelines.kfp.compile MODULE_OR_FILE:FN OUT.yaml``."""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import sys


def load(target: str) -> object:
    where, _, fn = target.rpartition(":")
    if not where or not fn:
        raise SystemExit(
            f"compile: expected MODULE:FUNCTION or path/file.py:FUNCTION, got {target!r}"
        )
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise SystemExit(f"compile: {where} does not exist")
        found = runpy.run_path(where).get(fn)
    else:  # getattr: a package's lazy names too
        found = getattr(importlib.import_module(where), fn, None)
    if found is None:
        raise SystemExit(f"compile: {where} has no {fn!r}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pipeline", help="MODULE:FUNCTION or path/file.py:FUNCTION")
    parser.add_argument("output", help="where the IR YAML goes")
    args = parser.parse_args(argv)
    from kfp import compiler

    compiler.Compiler().compile(load(args.pipeline), args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
