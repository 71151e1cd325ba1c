"""The program of ``utils.booth``: evaluate the booth function for one HPO trial.

Prints ``booth(x1, x2) = value`` and records ``{"booth_eval": value}`` under key
``trial_idx`` of an ``FsspecResultTracker(tracker_base)`` (the file
``<tracker_base>/<trial_idx>``, any fsspec URL, as upstream), where an HPO driver reads it.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def booth(x1: float, x2: float) -> float:
    return (x1 + 2 * x2 - 7) ** 2 + (2 * x1 + x2 - 5) ** 2


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--x1", type=float, required=True)
    parser.add_argument("--x2", type=float, required=True)
    parser.add_argument("--trial_idx", type=int, default=0)
    parser.add_argument("--tracker_base", default="/tmp/torchx-util-booth")
    args = parser.parse_args(argv)
    value = booth(args.x1, args.x2)
    print(f"booth({args.x1}, {args.x2}) = {value}")
    from torchx.runtime.tracking import FsspecResultTracker

    FsspecResultTracker(args.tracker_base)[args.trial_idx] = {"booth_eval": value}
    return 0


if __name__ == "__main__":
    sys.exit(main())
