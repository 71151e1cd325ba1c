"""Stall detection on aws_batch, against moto (server mode, through boto3).

No Batch can run here: moto stores jobs and CloudWatch log events, and the tests play
Batch's compute side (a node that ended with the watchdog's exit code, the last line the
watchdog wrote to its log), as the scheduler's other tests do. What is real: the job
definition runs each node's command under ``torchx.runtime.watchdog`` (and ``describe``
reads the role's own command back), and a fresh runner reads the reason back from Batch and
CloudWatch Logs. The watchdog itself is tested on real processes
(``tests/runtime/test_watchdog.py``).
"""

from __future__ import annotations

from tests.schedulers.moto_server import MotoBatchServer
from tests.schedulers.test_aws_batch_scheduler import _job_id
from torchx import specs
from torchx.runner import get_runner
from torchx.runtime.watchdog import MARK, STALLED_EXIT

QUEUE = "torchx-stall-q"
REASON = "stalled: no progress or output for 2 s (no step reported)"


def _app() -> specs.AppDef:
    role = specs.Role(
        "train",
        image="alpine",
        entrypoint="sleep",
        args=["600"],
        num_replicas=2,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )
    return specs.AppDef("stall", [role])


def ended(moto: MotoBatchServer, job_id: str, code: int) -> None:
    """Play Batch: the job or node ended FAILED with ``code`` as its last attempt's exit
    code (where Batch reports it; moto's own describe leaves it out of multi-node jobs)."""
    moto.set_status(job_id, "FAILED", exit_code=code)
    moto.job(job_id).attempts[-1]["container"]["exitCode"] = code


def test_a_watched_batch_job_runs_its_nodes_under_the_watchdog(moto: MotoBatchServer) -> None:
    runner = get_runner(trackers={})
    handle = runner.run(_app(), "aws_batch", {"queue": QUEUE}, stall_timeout=2)
    definition = moto.job(_job_id(handle)).job_definition
    (node_range,) = definition.node_properties["nodeRangeProperties"]
    command = node_range["container"]["command"]
    watch = ["python", "-m", "torchx.runtime.watchdog", "2"]
    # nodes share no directory: the watchdog judges node 0 only
    assert command == [*watch, "--only-where", "AWS_BATCH_JOB_NODE_INDEX=0", "--", "sleep", "600"]
    app = runner.describe(handle)
    assert app is not None and (app.roles[0].entrypoint, app.roles[0].args) == ("sleep", ["600"])


def test_a_node_its_watchdog_stopped_reads_failed_with_the_reason(moto: MotoBatchServer) -> None:
    runner = get_runner(trackers={})
    handle = runner.run(_app(), "aws_batch", {"queue": QUEUE}, stall_timeout=2)
    job_id = _job_id(handle)
    moto.set_status(job_id, "RUNNING")  # play Batch: node 1's watchdog ended it, then the job
    node_ids = moto.add_node_jobs(job_id, ["RUNNING", "RUNNING"])
    stream = f"{moto.job(job_id).job_definition.name}/default/node-1"
    moto.put_logs(stream, ["tick 1", f"{MARK}{REASON}"])
    ended(moto, node_ids[1], STALLED_EXIT)
    ended(moto, node_ids[0], 143)
    ended(moto, job_id, STALLED_EXIT)

    status = get_runner(trackers={}).wait(handle, wait_interval=0.5, timeout=60)
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert status.msg == REASON


def test_an_ordinary_batch_failure_keeps_its_own_message(moto: MotoBatchServer) -> None:
    runner = get_runner(trackers={})
    handle = runner.run(_app(), "aws_batch", {"queue": QUEUE}, stall_timeout=2)
    job_id = _job_id(handle)
    moto.set_status(job_id, "RUNNING")
    node_ids = moto.add_node_jobs(job_id, ["RUNNING", "RUNNING"])
    for node_id in node_ids:
        ended(moto, node_id, 1)
    moto.set_status(job_id, "FAILED", reason="Essential container in task exited")
    ended(moto, job_id, 1)
    status = get_runner(trackers={}).status(handle)
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert "stalled" not in status.msg and "exit code 1" in status.msg, status.msg
