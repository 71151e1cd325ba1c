"""Stage 3: score the trained model on the test split; writes metrics.json and a
confusion-matrix image to --output_path.

    python examples/apps/evaluate.py --model_path M --data_path D --output_path E
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tracking  # noqa: E402
from common import (  # noqa: E402
    join,
    load_split,
    make_model,
    read_bytes,
    read_json,
    record_errors,
    write_bytes,
    write_json,
)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model_path", required=True, help="directory with model.pt and model.json")
    p.add_argument("--data_path", required=True, help="splits written by datapreproc")
    p.add_argument(
        "--output_path", required=True, help="where metrics.json and confusion_matrix.png go"
    )
    return p.parse_args(argv)


def confusion_png(cm: np.ndarray) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.imshow(cm, cmap="Blues")
    for (i, j), v in np.ndenumerate(cm):
        ax.text(j, i, str(v), ha="center", va="center", fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("digits: confusion matrix")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


@record_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    meta = read_json(join(args.model_path, "model.json"))
    model = make_model(meta["in_features"], meta["hidden"], meta["classes"])
    model.load_state_dict(
        torch.load(io.BytesIO(read_bytes(join(args.model_path, "model.pt"))), weights_only=True)
    )
    model.eval()
    x, y = load_split(args.data_path, "test")
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    classes = meta["classes"]
    cm = np.zeros((classes, classes), dtype=np.int64)
    for t, p in zip(y, pred, strict=True):
        cm[t, p] += 1
    accuracy = float((pred == y).mean())
    precision = [
        float(cm[c, c] / cm[:, c].sum()) if cm[:, c].sum() else 0.0 for c in range(classes)
    ]
    recall = [float(cm[c, c] / cm[c, :].sum()) if cm[c, :].sum() else 0.0 for c in range(classes)]
    metrics = {
        "test_accuracy": accuracy,
        "precision": precision,
        "recall": recall,
        "confusion_matrix": cm.tolist(),
        "test_rows": int(len(y)),
    }
    write_json(join(args.output_path, "metrics.json"), metrics)
    write_bytes(join(args.output_path, "confusion_matrix.png"), confusion_png(cm))
    tracking.record_input(args.model_path)
    tracking.record_input(args.data_path)
    tracking.run().add_metadata(stage="evaluate", test_accuracy=round(accuracy, 4))
    tracking.run().log_metrics({"test_accuracy": accuracy})
    tracking.record_output(
        args.output_path, "metrics", {"type": "metrics", "test_accuracy": accuracy}
    )
    print(f"test_accuracy={accuracy:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
