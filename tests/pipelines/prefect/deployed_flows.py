"""Flows that tests/deployments/test_prefect_deployment.py deploys to a real Prefect server
and worker (``flow.from_source(<this dir>, "deployed_flows.py:<fn>").deploy()``).

Each stage runs ``utils.sh`` with a command that names its stage key, so a test finds the
apps of a stage on the scheduler (``runner.describe``) and counts them.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType
from typing import Any, Dict, List, Optional

from prefect import flow

from torchx.pipelines.prefect import (
    TorchXJob,
    cancel_flow_run_apps,
    close_pipeline_run,
    submit,
    wait,
)

HOOKS: Dict[str, Any] = {
    "on_cancellation": [cancel_flow_run_apps],
    "on_crashed": [cancel_flow_run_apps],
    "on_completion": [close_pipeline_run],
    "on_failure": [close_pipeline_run],
}

TRANSIENT_ERROR = "injected transient error"


def command(key: str, seconds: float, gate: str = "") -> List[str]:
    """``sh -c`` that sleeps, then (with ``gate``) waits for that file, then says done."""
    script = f"sleep {seconds}; "
    if gate:
        script += f"while [ ! -e {gate} ]; do sleep 0.2; done; "
    return ["sh", "-c", script + f"echo {key} done"]


def _inject_transient_error() -> None:
    """Raise one ``ConnectionError`` in the main thread while it is inside torchx's wait
    (a SIGALRM every 0.3 s until it lands there): an ordinary error, as a flaky network
    gives, at the point where the wait used to cancel the app on any exception."""
    previous = signal.getsignal(signal.SIGALRM)

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        f = frame
        while f is not None and f.f_code.co_name != "wait_or_cancel":
            f = f.f_back
        if f is None:  # not waiting yet (or any more): try again shortly
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            return
        signal.signal(signal.SIGALRM, previous)
        raise ConnectionError(TRANSIENT_ERROR)

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.3)


@flow(name="torchx-deployed-stages", **HOOKS)
def stages(
    run: str,
    seconds: List[float],
    gate: str = "",
    wait_retries: int = 0,
    transient_error: bool = False,
    hook_only: bool = False,
) -> List[str]:
    """One ``submit`` + ``wait`` per entry of ``seconds`` (keys ``<run>-<i>``); the last
    stage also waits for the file ``gate``. With ``transient_error``, each wait gets one
    ``ConnectionError`` (and ``wait_retries`` retries). With ``hook_only``, the flow does
    not wait but sleeps: only the ``cancel_flow_run_apps`` hook can cancel its apps."""
    handles = []
    for i, s in enumerate(seconds):
        key = f"{run}-{i}"
        last = i == len(seconds) - 1
        handle = submit("utils.sh", command(key, s, gate if last else ""), key=key)
        if hook_only:
            time.sleep(600)
        if transient_error:
            _inject_transient_error()
        wait.with_options(retries=wait_retries, retry_delay_seconds=0)(handle, key=key)
        handles.append(handle)
    return handles


@flow(name="torchx-deployed-job-block", **HOOKS)
async def job_block(run: str, seconds: float) -> Dict[str, Any]:
    """The ``TorchXJob`` block in an async flow: saved, loaded, triggered, waited on."""
    await TorchXJob(component="utils.sh", component_args=command(run, seconds), key=run).save(
        run, overwrite=True
    )
    job = await TorchXJob.load(run)
    job_run = await job.trigger()
    await job_run.wait_for_completion()
    return await job_run.fetch_result()


if __name__ == "__main__":
    sys.exit("deployed by tests/deployments/test_prefect_deployment.py")
