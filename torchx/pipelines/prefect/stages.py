"""Where each stage of a flow run lives, recorded on the flow run itself.

Prefect runs ``on_cancellation`` and ``on_crashed`` hooks in the *worker*, whose settings
may differ from the flow run's (a deployment's ``job_variables`` set the flow run's env
only). So before a stage is submitted, the flow run gets a record (a flow-run input, one
per stage) of what reaches its app from any process: scheduler, idempotency key,
``TORCHX_HOME`` and trackers (credentials are not recorded: the worker needs its own).
``cancel_stages`` cancels with those settings, in a child process when this process's
``TORCHX_HOME`` differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence
from uuid import UUID

from torchx.pipelines import core
from torchx.runner.api import get_runner
from torchx.trackers.mlflow_http import redact
from torchx.util.paths import ENV_TORCHX_HOME, torchx_home

logger = logging.getLogger(__name__)

INPUT_PREFIX = "torchx-stage-"  # flow-run input keys: lowercase letters, digits, dashes
LABEL_PREFIX = "torchx.stage."  # flow-run labels, where torchx 0.8.0.dev0 recorded stages
MAX_STAGES = 100_000  # records read per flow run
CHILD_TIMEOUT = 300.0  # a cancel waits for the app to end (the scheduler's grace period)


@dataclass(frozen=True)
class StageRecord:
    """What reaches a stage's app from any process (one flow-run input per stage)."""

    scheduler: str
    key: str
    torchx_home: str
    trackers: Dict[str, Optional[str]] = field(default_factory=dict)
    cfg: Dict[str, Any] = field(default_factory=dict)  # where the scheduler looks (namespace)

    def where(self) -> str:
        """The settings the app is reached with (stages sharing them are handled together)."""
        return json.dumps([self.torchx_home, self.trackers], sort_keys=True)


def here(
    scheduler: str,
    key: str,
    trackers: Dict[str, Optional[str]],
    cfg: Optional[Dict[str, Any]] = None,
) -> StageRecord:
    """The record of a stage this process submits; a tracker URI's user and password are
    left out (flow-run inputs are visible to every Prefect user)."""
    public = {name: redact(config) if config else config for name, config in trackers.items()}
    return StageRecord(scheduler, key, str(torchx_home()), public, dict(cfg or {}))


def record_stage(flow_run_id: str, record: StageRecord) -> None:
    """Record the stage on the flow run *before* it is submitted: a cancel that comes while
    the submission is under way still finds the app through its key.

    An input of its own per stage, not a flow-run label: a label update rewrites the one
    ``labels`` field every stage shares, and on Prefect's sqlite server it waited 2-6 s
    behind the server's own writes at each stage's start (benchmarks/RESULTS.md)."""
    import httpx  # Prefect's; imported here, as Prefect is: the cancel child needs neither
    from prefect.client.orchestration import get_client

    key = INPUT_PREFIX + hashlib.sha256(record.key.encode()).hexdigest()[:16]
    value = json.dumps(asdict(record))
    with get_client(sync_client=True) as client:
        try:
            client.create_flow_run_input(UUID(flow_run_id), key, value)
        except httpx.HTTPStatusError as e:
            if e.response.status_code != httpx.codes.CONFLICT:
                raise
            # the stage again (a retry): its latest settings are the ones that reach the app
            client.delete_flow_run_input(UUID(flow_run_id), key)
            client.create_flow_run_input(UUID(flow_run_id), key, value)


def read_stages(flow_run_id: str) -> List[StageRecord]:
    """Every stage the flow run recorded, labels of an earlier torchx included (an
    unreadable record is logged and skipped)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        inputs = client.filter_flow_run_input(UUID(flow_run_id), INPUT_PREFIX, MAX_STAGES, set())
        labels = client.read_flow_run(UUID(flow_run_id)).labels
    found = [(i.key, i.value) for i in inputs]
    found += [(k, str(v)) for k, v in labels.items() if k.startswith(LABEL_PREFIX)]
    records: Dict[str, StageRecord] = {}
    for name, value in found:
        try:
            record = StageRecord(**json.loads(value))
        except (TypeError, ValueError) as e:
            logger.warning("skipping the flow run's stage record %s=%r: %s", name, value, e)
            continue
        records.setdefault(record.key, record)
    return list(records.values())


def cancel_stages(
    records: Sequence[StageRecord],
    pipeline_run: str,
    log: core.Log,
    trackers_here: Dict[str, Optional[str]],
) -> None:
    """Cancel every stage's live app and end ``pipeline_run`` KILLED, with the settings each
    was recorded with (``trackers_here`` when none was)."""
    if not records:
        _cancel_here([], pipeline_run, trackers_here, log)
        return
    groups: Dict[str, List[StageRecord]] = {}
    for r in records:
        groups.setdefault(r.where(), []).append(r)
    for i, group in enumerate(groups.values()):
        run = pipeline_run if i == 0 else None  # the flow run's settings are all the same
        if group[0].torchx_home == str(torchx_home()):
            _cancel_here(group, run, group[0].trackers, log)
        else:
            _cancel_in_child(group, run, log)


def _cancel_here(
    records: Sequence[StageRecord],
    pipeline_run: Optional[str],
    trackers: Dict[str, Optional[str]],
    log: core.Log,
) -> None:
    with get_runner(trackers=trackers) as runner:
        for r in records:
            handle = runner.find_by_idempotency_key(r.scheduler, r.key, cfg=r.cfg)  # live
            if handle is not None:
                log.info("cancelling %s (stage %s)", handle, r.key)
                core.cancel_quietly(runner, handle, log)
        if pipeline_run:
            core.close_pipeline_run(pipeline_run, trackers, core.KILLED)


def _cancel_in_child(
    records: Sequence[StageRecord], pipeline_run: Optional[str], log: core.Log
) -> None:
    """``_cancel_here`` in a child process whose ``TORCHX_HOME`` is the records' (this
    process's environment is left alone); its output goes to ``log``."""
    home = records[0].torchx_home
    request = json.dumps({"stages": [asdict(r) for r in records], "pipeline_run": pipeline_run})
    log.info("cancelling %d stage(s) with TORCHX_HOME=%s", len(records), home)
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, request],
            env={**os.environ, ENV_TORCHX_HOME: home},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        log.warning("cancelling stages under %s took over %.0f s", home, CHILD_TIMEOUT)
        return
    for line in (done.stdout + done.stderr).splitlines():
        if line.strip():
            log.info("%s", line)
    if done.returncode != 0:
        log.warning("cancelling stages under %s exited with %d", home, done.returncode)


def _main(argv: List[str]) -> int:
    request: Dict[str, Any] = json.loads(argv[1])
    records = [StageRecord(**r) for r in request["stages"]]
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    _cancel_here(records, request.get("pipeline_run"), records[0].trackers, logger)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
