"""Stage 1: load scikit-learn's bundled handwritten digits (no download), normalise them
with statistics of the training split only, and write seeded train/val/test splits.

    python examples/apps/datapreproc.py --output_path /tmp/digits
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import os
import sys
from typing import List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tracking  # noqa: E402
from common import join, record_errors, save_split, write_json  # noqa: E402


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--output_path", required=True, help="where the splits go (path or fsspec URL)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split")
    p.add_argument(
        "--val_fraction", type=float, default=0.15, help="fraction of rows for validation"
    )
    p.add_argument("--test_fraction", type=float, default=0.15, help="fraction of rows for test")
    p.add_argument("--limit", type=int, default=None, help="keep only this many rows (quick runs)")
    return p.parse_args(argv)


def load_digits() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (features, labels), read from the file it ships: importing
    sklearn costs ~1.5 s of CPU, more than this whole stage's work."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    roots = spec.submodule_search_locations if spec is not None else None
    path = os.path.join(roots[0], "datasets", "data", "digits.csv.gz") if roots else ""
    if os.path.exists(path):
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        return data[:, :-1], data[:, -1]
    from sklearn.datasets import load_digits as load  # another layout: sklearn's own loader

    return load(return_X_y=True)


@record_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    data, target = load_digits()
    x, y = data.astype(np.float32), target.astype(np.int64)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(x))
    if args.limit:
        order = order[: args.limit]
    n_test = int(len(order) * args.test_fraction)
    n_val = int(len(order) * args.val_fraction)
    idx = {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }
    mean = x[idx["train"]].mean(axis=0)
    std = x[idx["train"]].std(axis=0) + 1e-6
    digests, rows = {}, {}
    for split, ids in idx.items():
        digests[split] = save_split(args.output_path, split, (x[ids] - mean) / std, y[ids])
        rows[split] = int(len(ids))
    digest = hashlib.sha256("".join(digests[s] for s in sorted(digests)).encode()).hexdigest()
    manifest = {
        "dataset": "sklearn.load_digits",
        "rows": rows,
        "digests": digests,
        "digest": digest,
        "seed": args.seed,
    }
    write_json(join(args.output_path, "manifest.json"), manifest)
    tracking.run().add_metadata(stage="datapreproc", rows_train=rows["train"], seed=args.seed)
    tracking.record_output(
        args.output_path,
        "dataset",
        {"type": "dataset", "digest": digest, "source": "sklearn.load_digits"},
    )
    print(
        f"wrote {sum(rows.values())} rows to {args.output_path}: {rows} digest={digest[:12]}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
