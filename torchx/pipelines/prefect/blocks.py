"""``TorchXJob``: a Prefect job block (``JobBlock``/``JobRun`` pattern) for one torchx component.

Triggered inside a flow run, its app is cancelled with the flow run by ``cancel_flow_run_apps``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional

from prefect.blocks.abstract import JobBlock, JobRun
from pydantic import Field

from torchx.pipelines import core
from torchx.pipelines.prefect.tasks import record_flow_run_stage


class TorchXJobRun(JobRun[Dict[str, Any]]):
    """A submitted torchx app."""

    def __init__(self, job: TorchXJob, handle: str) -> None:
        self._job = job
        self.handle = handle
        self.status: Any = None

    async def wait_for_completion(self) -> None:  # type: ignore[override]
        """Wait for the app to end (cancelling it if the wait is interrupted)."""

        def _wait() -> Any:
            with core.runner_for() as runner:
                try:
                    return core.wait_or_cancel(runner, self.handle, self._job.poll_interval)
                except core.StageFailed as e:
                    return e.status

        self.status = await asyncio.to_thread(_wait)
        self.logger.info("%s %s", self.handle, self.status.state if self.status else "UNKNOWN")

    async def fetch_result(self) -> Dict[str, Any]:
        """The final status as JSON; raises ``TorchXJobFailed`` if the app did not succeed."""
        if self.status is None:
            await self.wait_for_completion()
        status = core.check_succeeded(self.handle, self.status)
        return {"app_handle": self.handle, **status.to_json()}


class TorchXJob(JobBlock):
    """Run a torchx component (builtin like ``dist.ddp`` or ``path/file.py:fn``) on a scheduler."""

    _block_type_name = "TorchX Job"
    _description = "Launch a PyTorch job (single process, distributed or elastic) with torchx."

    component: str = Field(
        ..., description="component name (e.g. dist.ddp) or path/to/file.py:function"
    )
    component_args: List[str] = Field(
        default_factory=list, description="component arguments, as on the command line"
    )
    scheduler: str = Field(
        default="local_cwd",
        description="torchx scheduler: local_cwd, slurm, kubernetes, aws_batch, ray",
    )
    cfg: Dict[str, Any] = Field(
        default_factory=dict, description="scheduler run options (see `torchx runopts`)"
    )
    parent_run_id: Optional[str] = Field(
        default=None, description="tracker run to nest the job's run under"
    )
    poll_interval: float = Field(default=1.0, description="seconds between status checks")

    async def trigger(self) -> TorchXJobRun:
        """Submit the component (or re-attach to this flow run's app of the same stage)."""
        from torchx.pipelines.prefect.tasks import stage_key

        def _submit() -> str:
            args = list(self.component_args)
            key = stage_key(self.component, args, self.scheduler, dict(self.cfg), None)
            record_flow_run_stage(self.scheduler, key)
            with core.runner_for() as runner:
                return core.submit_or_attach(
                    runner,
                    self.component,
                    args,
                    self.scheduler,
                    dict(self.cfg),
                    key,
                    parent_run_id=self.parent_run_id,
                    reattach_succeeded=True,
                ).handle

        handle = await asyncio.to_thread(_submit)
        self.logger.info("submitted %s", handle)
        return TorchXJobRun(self, handle)
