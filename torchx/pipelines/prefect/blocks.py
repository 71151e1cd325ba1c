"""``TorchXJob``: a Prefect job block (``JobBlock``/``JobRun`` pattern) for one torchx component.

Triggered inside a flow run, its app is cancelled with the flow run by ``cancel_flow_run_apps``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional

from prefect.blocks.abstract import JobBlock, JobRun
from pydantic import Field

from torchx.pipelines.prefect.tasks import record_flow_run_app
from torchx.specs.api import AppState


class TorchXJobRun(JobRun[Dict[str, Any]]):
    """A submitted torchx app."""

    def __init__(self, job: TorchXJob, handle: str) -> None:
        self._job = job
        self.handle = handle
        self.status: Any = None

    async def wait_for_completion(self) -> None:  # type: ignore[override]
        from torchx.runner import get_runner

        def _wait() -> Any:
            with get_runner() as runner:
                return runner.wait(self.handle, wait_interval=self._job.poll_interval)

        try:
            self.status = await asyncio.to_thread(_wait)
        except BaseException:
            await asyncio.to_thread(self._cancel)
            raise
        self.logger.info("%s %s", self.handle, self.status.state if self.status else "UNKNOWN")

    def _cancel(self) -> None:
        from torchx.runner import get_runner

        with get_runner() as runner:
            runner.cancel(self.handle)

    async def fetch_result(self) -> Dict[str, Any]:
        """The final status as JSON; raises ``TorchXJobFailed`` if the app did not succeed."""
        from torchx.pipelines.prefect.tasks import TorchXJobFailed

        if self.status is None:
            await self.wait_for_completion()
        if self.status is None or self.status.state != AppState.SUCCEEDED:
            raise TorchXJobFailed(self.handle, self.status)
        return {"app_handle": self.handle, **self.status.to_json()}


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
        from torchx.runner import get_runner

        def _submit() -> str:
            with get_runner() as runner:
                return runner.run_component(
                    self.component,
                    list(self.component_args),
                    self.scheduler,
                    dict(self.cfg),
                    parent_run_id=self.parent_run_id,
                )

        handle = await asyncio.to_thread(_submit)
        record_flow_run_app(handle)
        self.logger.info("submitted %s", handle)
        return TorchXJobRun(self, handle)
