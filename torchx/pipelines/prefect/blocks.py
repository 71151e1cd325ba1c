"""``TorchXJob``: a Prefect job block (``JobBlock``/``JobRun`` pattern) for one torchx
component. It runs the ``submit`` and ``wait`` tasks' own code, so it behaves as they do.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Union

from prefect.blocks.abstract import JobBlock, JobRun
from pydantic import Field

from torchx.pipelines import core
from torchx.pipelines.prefect.tasks import CANCELLATIONS, stage_name, submit_stage, wait_stage
from torchx.runner.api import get_runner


class TorchXJobRun(JobRun[Dict[str, Any]]):
    """A submitted torchx app: wait for it, then fetch its final status.

    Attributes:
        handle: the app handle (``scheduler://session/app_id``)
        status: the app's final status once ``wait_for_completion`` returned, else None
    """

    def __init__(self, job: TorchXJob, handle: str) -> None:
        self._job = job
        self.handle = handle
        self.status: Any = None

    async def wait_for_completion(self) -> None:  # type: ignore[override]
        """Wait for the app to end, streaming its log lines into the Prefect logger and
        publishing the stage's artifacts. A failed app does not raise here (``fetch_result``
        does); a cancelled wait (the flow run cancelled or timed out) cancels the app."""
        job, logger = self._job, self.logger

        def _wait() -> Any:
            key = stage_name(job.component, job.key)
            try:
                return wait_stage(
                    self.handle, job.poll_interval, job.get_logs, key, logger, job.progress_interval
                )
            except core.StageFailed as e:
                logger.warning("%s", e)
                return e.status

        try:
            self.status = await asyncio.to_thread(_wait)
        except CANCELLATIONS as e:  # the thread's wait cannot see these: cancel here
            logger.warning("wait cancelled (%s): cancelling %s", type(e).__name__, self.handle)
            with get_runner() as runner:  # blocking: the flow run is going away
                core.cancel_quietly(runner, self.handle, logger)
            raise

    async def fetch_result(self) -> Dict[str, Any]:
        """The final status as JSON (``app_handle`` added), waiting first if need be;
        raises ``TorchXJobFailed`` (with the worker's error) unless the app SUCCEEDED."""
        if self.status is None:
            await self.wait_for_completion()
        status = core.check_succeeded(self.handle, self.status)
        return {"app_handle": self.handle, **status.to_json()}


class TorchXJob(JobBlock):
    """Run a torchx component (builtin like ``dist.ddp`` or ``path/file.py:fn``) on a scheduler.

    Attributes:
        component: component name (``dist.ddp``) or ``path/to/file.py:function``
        component_args: the component's arguments, as a list (``["--msg", "hi"]``) or a dict
            of its parameters (a variadic component's extras under ``"args"``:
            ``{"script": "train.py", "j": "1x2", "args": ["--epochs", "3"]}``)
        scheduler: torchx scheduler (``local_cwd``, ``slurm``, ``kubernetes``, ...)
        cfg: scheduler run options (see ``torchx runopts``)
        key: names this stage within the flow run: a trigger again with the same key
            re-attaches to its app, and its artifacts are ``torchx-mlflow-<key>``,
            ``torchx-replicas-<key>``, ``torchx-logs-<key>`` (default: the component's name,
            with the idempotency key a digest of what it runs)
        parent_run_id: tracker run to nest the job's run under (default: the flow run's
            pipeline run; none outside a flow run)
        poll_interval: seconds between status checks where the scheduler cannot push
        get_logs: copy the replicas' log lines into the Prefect logger while waiting
        progress_interval: seconds between reads of the job's progress report: a changed
            one updates the progress artifact ``torchx-progress-<key>`` (None: none)
        stall_timeout: seconds; the job fails ``stalled: ...`` when it neither prints nor
            reports progress for that long (stored with the job)

    Example:
        ```python
        run = await TorchXJob(component="utils.echo", component_args={"msg": "hi"}).trigger()
        await run.wait_for_completion()
        status = await run.fetch_result()
        ```
    """

    _block_type_name = "TorchX Job"
    _description = "Launch a PyTorch job (single process, distributed or elastic) with torchx."

    component: str = Field(
        ..., description="component name (e.g. dist.ddp) or path/to/file.py:function"
    )
    component_args: Union[List[str], Dict[str, Any]] = Field(
        default_factory=list,
        description="component arguments: a list as on the command line, or a dict of"
        " parameters (a variadic component's extras under 'args')",
    )
    scheduler: str = Field(
        default="local_cwd",
        description="torchx scheduler: local_cwd, slurm, kubernetes, aws_batch, ray",
    )
    cfg: Dict[str, Any] = Field(
        default_factory=dict, description="scheduler run options (see `torchx runopts`)"
    )
    key: Optional[str] = Field(
        default=None,
        description="the stage's name in the flow run: idempotency and artifact keys",
    )
    parent_run_id: Optional[str] = Field(
        default=None,
        description="tracker run to nest the job's run under (default: the flow run's)",
    )
    poll_interval: float = Field(default=1.0, description="seconds between status checks")
    get_logs: bool = Field(
        default=True, description="copy the replicas' log lines into the Prefect logger"
    )
    progress_interval: Optional[float] = Field(
        default=core.PROGRESS_INTERVAL,
        description="seconds between progress reads into the progress artifact (None: none)",
    )
    stall_timeout: Optional[float] = Field(
        default=None,
        description="seconds without output or progress after which the job fails 'stalled'",
    )

    async def trigger(self) -> TorchXJobRun:
        """Submit the component, or re-attach to this flow run's app of the same stage (a
        retried flow run does not launch it twice); returns the run to wait on."""
        args = self.component_args
        handle = await asyncio.to_thread(
            submit_stage,
            self.component,
            list(args) if isinstance(args, list) else dict(args),
            self.scheduler,
            dict(self.cfg),
            self.key,
            self.parent_run_id,
            self.logger,
            self.stall_timeout,
        )
        return TorchXJobRun(self, handle)
