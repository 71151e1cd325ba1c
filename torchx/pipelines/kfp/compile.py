"""Compile a KFP pipeline function to IR YAML:
``python -m torchx.pipelines.kfp.compile MODULE_OR_FILE:FN OUT.yaml``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
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
        spec = importlib.util.spec_from_file_location("_pipeline_module", where)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["_pipeline_module"] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        module = importlib.import_module(where)
    if not hasattr(module, fn):
        raise SystemExit(f"compile: {where} has no {fn!r}")
    return getattr(module, fn)


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
