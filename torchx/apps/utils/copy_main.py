"""Copy one file between any two fsspec locations (used by the ``utils.copy`` component)."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import List, Optional

import fsspec


def copy(src: str, dst: str) -> None:
    with fsspec.open(src, "rb") as fin, fsspec.open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", required=True, help="source path or URL")
    parser.add_argument("--dst", required=True, help="destination path or URL")
    args = parser.parse_args(argv)
    try:
        copy(args.src, args.dst)
    except FileNotFoundError as e:
        print(f"copy: {e}", file=sys.stderr)
        return 1
    print(f"copied {args.src} to {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
