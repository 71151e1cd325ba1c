"""A flow that ``flow.serve()`` runs in a subprocess, so the cancellation tests go through a
Prefect runner (the only place Prefect enforces a flow-run cancellation made through the API).

    python served_flow.py DEPLOYMENT_NAME
"""

from __future__ import annotations

import sys
import time

from prefect import flow

from torchx.pipelines.prefect import cancel_flow_run_apps, submit, wait


@flow(name="torchx-long-job", on_cancellation=[cancel_flow_run_apps])
def long_job(wait_in_task: bool = True) -> None:
    """A two-replica app that runs for 10 minutes.

    ``wait_in_task``: the flow waits in the ``wait`` task (which cancels the app when
    interrupted); otherwise the flow is busy elsewhere and only the hook can cancel it.
    """
    handle = submit("utils.sh", ["--num_replicas", "2", "sleep", "600"])
    if wait_in_task:
        wait(handle)
    else:
        time.sleep(600)


if __name__ == "__main__":
    long_job.serve(name=sys.argv[1])
