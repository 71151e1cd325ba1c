"""What the tests read back from the Prefect API: a flow run's logs, artifacts, task runs."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List


def flow_run_logs(flow_run_id: Any, needle: str, timeout: float = 60) -> List[str]:
    """The flow run's log messages as Prefect stored them (sent in batches: poll until one
    contains ``needle``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read() -> List[str]:
        async with get_client() as client:
            logs = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
        return [log.message for log in logs]

    deadline = time.monotonic() + timeout
    messages = asyncio.run(read())
    while not any(needle in m for m in messages) and time.monotonic() < deadline:
        time.sleep(0.2)
        messages = asyncio.run(read())
    return messages


def flow_run_artifacts(flow_run_id: Any) -> Dict[str, Any]:
    """``{key: data}`` of the artifacts the flow run (and its tasks) created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read() -> Dict[str, Any]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )
        return {a.key: a.data for a in found}

    return asyncio.run(read())


def flow_run_task_runs(flow_run_id: Any) -> List[Any]:
    """The flow run's task runs (``name``, ``state``), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    async def read() -> List[Any]:
        async with get_client() as client:
            return list(
                await client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                    sort=TaskRunSort.EXPECTED_START_TIME_ASC,
                )
            )

    return asyncio.run(read())
