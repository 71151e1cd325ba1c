"""A flow that ``flow.serve()`` runs in a subprocess, so the cancellation tests go through a
Prefect runner: the only place Prefect enforces a flow-run cancellation made through the API,
and where it runs the ``on_cancellation`` and ``on_crashed`` hooks.

    python served_flow.py DEPLOYMENT_NAME
"""

from __future__ import annotations

import sys
import time

from prefect import flow
from prefect.utilities.asyncutils import run_coro_as_sync

from torchx.pipelines.prefect import TorchXJob, cancel_flow_run_apps, submit, wait

SLEEPERS = ["--num_replicas", "2", "sleep", "600"]


@flow(
    name="torchx-long-job",
    on_cancellation=[cancel_flow_run_apps],
    on_crashed=[cancel_flow_run_apps],
)
def long_job(mode: str = "wait") -> None:
    """A two-replica app that runs for 10 minutes, launched and followed as ``mode`` says.

    - ``wait``: ``submit``, then the ``wait`` task (which cancels the app when interrupted);
    - ``hook``: ``submit``, then the flow is busy elsewhere: only the hook can cancel the app;
    - ``block``: a ``TorchXJob`` block's ``trigger()``, then busy elsewhere, as for ``hook``.
    """
    if mode == "wait":
        wait(submit("utils.sh", SLEEPERS))
        return
    if mode == "hook":
        submit("utils.sh", SLEEPERS)
    elif mode == "block":
        run_coro_as_sync(TorchXJob(component="utils.sh", component_args=SLEEPERS).trigger())
    else:
        raise ValueError(f"unknown mode {mode!r}: wait, hook or block")
    time.sleep(600)


if __name__ == "__main__":
    long_job.serve(name=sys.argv[1])
