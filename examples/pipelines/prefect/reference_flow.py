"""The reference pipeline as a Prefect 3 flow: datapreproc -> elastic DDP train -> evaluate.

    python examples/pipelines/prefect/reference_flow.py --out ./out-prefect

Each stage is a torchx app (one ``run`` task: submit, then wait) on any scheduler;
cancelling the flow run cancels the running app; lineage goes under one tracker run per
flow run. (``submit`` and ``wait`` are the two halves, for stages that overlap.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from prefect import flow

from torchx.pipelines.prefect import cancel_flow_run_apps, close_pipeline_run, run

COMPONENTS = str(Path(__file__).resolve().parents[2] / "components.py")


@flow(
    name="torchx-reference",
    on_cancellation=[cancel_flow_run_apps],
    on_crashed=[cancel_flow_run_apps],
    on_completion=[close_pipeline_run],
    on_failure=[close_pipeline_run],
)
def reference_flow(
    base_dir: str,
    scheduler: str = "local_cwd",
    j: str = "1:2x1",
    epochs: int = 20,
    limit: int = 0,
    train_cfg: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """datapreproc -> train -> evaluate; returns each stage's app handle and the accuracy.

    Args:
        base_dir: where the stages write data, checkpoints, model and metrics (path or URL)
        scheduler: torchx scheduler every stage runs on
        j: train's ``dist.ddp -j`` (``MIN:MAXxNPROC`` for elastic)
        epochs: training epochs
        limit: rows of the data set to use (0: all)
        train_cfg: scheduler run options of the train stage
    """
    data, model, evaluation = f"{base_dir}/data", f"{base_dir}/model", f"{base_dir}/eval"
    prep_args: Dict[str, Any] = {"output_path": data}
    if limit:
        prep_args["limit"] = limit
    prep = run(f"{COMPONENTS}:datapreproc", prep_args, scheduler, key="datapreproc")
    train = run(
        f"{COMPONENTS}:trainer",
        {
            "data_path": data,
            "output_path": model,
            "checkpoint_path": f"{base_dir}/checkpoints",
            "j": j,
            "epochs": epochs,
        },
        scheduler,
        cfg=train_cfg or {},
        key="train",
    )
    ev = run(
        f"{COMPONENTS}:evaluate",
        {"model_path": model, "data_path": data, "output_path": evaluation},
        scheduler,
        key="evaluate",
    )
    accuracy = (
        json.loads(Path(evaluation, "metrics.json").read_text())["test_accuracy"]
        if "://" not in evaluation
        else None
    )
    return {"datapreproc": prep, "train": train, "evaluate": ev, "test_accuracy": accuracy}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="out-prefect")
    parser.add_argument("--j", default="1:2x1")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHX_HOME", str(out / "torchx_home"))
    os.environ.setdefault("TORCHX_TRACKERS", "mlflow")
    os.environ.setdefault("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{out / 'mlflow.db'}")
    result = reference_flow(
        base_dir=str(out / "pipeline"), j=args.j, epochs=args.epochs, limit=args.limit
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
