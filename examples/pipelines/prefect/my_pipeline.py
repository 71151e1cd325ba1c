"""Your own 3-stage pipeline as a Prefect flow: plain programs, no tracker calls in them.

    TORCHX_TRACKERS=mlflow TORCHX_TRACKER_MLFLOW_CONFIG=http://127.0.0.1:5000 \\
        python examples/pipelines/prefect/my_pipeline.py --workdir ./out-mine

Each stage shows one way to launch a torchx component from Prefect:

- ``prep``: the ``run`` task (submit and wait in one task);
- ``train``: the ``submit`` and ``wait`` tasks (for a real trainer:
  ``submit("dist.ddp", {"script": "train.py", "j": "1x2", "args": [...]}, key="train")``);
- ``report``: a ``TorchXJob`` block (save it with ``.save("name")`` to reuse it from the UI).

Every stage gets its own MLflow run, named after its ``key``, with the component, args,
scheduler, resources and this flow run's parameters as params, nested under the flow run's
pipeline run, which ends with the flow run. The Prefect UI shows each stage's logs, a
replica-state table and (with an MLflow server) a link to its run, under per-stage keys.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Dict

from prefect import flow
from prefect.utilities.asyncutils import run_coro_as_sync

from torchx.pipelines.prefect import (
    TorchXJob,
    cancel_flow_run_apps,
    close_pipeline_run,
    run,
    submit,
    wait,
)


@flow(
    name="my-pipeline",
    on_cancellation=[cancel_flow_run_apps],
    on_crashed=[cancel_flow_run_apps],
    on_completion=[close_pipeline_run],
    on_failure=[close_pipeline_run],
)
def my_pipeline(
    workdir: str, greeting: str = "hello", scheduler: str = "local_cwd"
) -> Dict[str, str]:
    """prep writes ``greeting`` to a data file, train "fits" it (counts its bytes into a
    model file), report echoes where the model is; returns each stage's app handle.

    Args:
        workdir: directory the stages share (data.txt, model.txt)
        greeting: what prep writes
        scheduler: torchx scheduler every stage runs on
    """
    data, model = shlex.quote(f"{workdir}/data.txt"), shlex.quote(f"{workdir}/model.txt")
    prep = run(
        "utils.sh",
        ["sh", "-c", f"echo {shlex.quote(greeting)} | tee {data}"],
        scheduler,
        key="prep",
    )
    train = submit(
        "utils.sh", ["sh", "-c", f"wc -c < {data} | tee {model}"], scheduler, key="train"
    )
    wait(train, key="train")
    report = TorchXJob(
        component="utils.echo",
        component_args={"msg": f"model written to {workdir}/model.txt"},
        scheduler=scheduler,
        key="report",
    )
    report_run = run_coro_as_sync(report.trigger())
    run_coro_as_sync(report_run.wait_for_completion())
    result = run_coro_as_sync(report_run.fetch_result())
    return {"prep": prep, "train": train, "report": result["app_handle"]}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", default="out-mine")
    parser.add_argument("--greeting", default="hello")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(json.dumps(my_pipeline(str(workdir), args.greeting), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
