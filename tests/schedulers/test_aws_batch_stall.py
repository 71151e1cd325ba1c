"""Stall detection by the waiter on aws_batch, against moto (server mode, through boto3).

No Batch can run here: moto stores jobs and CloudWatch log events, and the test plays
Batch's compute side (a running job, its nodes' log lines, the FAILED state a terminated
job reaches), as the scheduler's other tests do. What is real: the scheduler reads the
newest CloudWatch event through the Logs API, ``Runner.wait`` stops the job through
``terminate_job`` with the stall reason, and a fresh runner reads it back from Batch.
"""

from __future__ import annotations

import threading

from tests.polling import poll_until
from tests.schedulers.moto_server import MotoBatchServer
from tests.schedulers.test_aws_batch_scheduler import _job_id
from torchx import specs
from torchx.runner import get_runner

QUEUE = "torchx-stall-q"


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


def test_batch_job_printing_runs_on_then_stalled_is_terminated_failed_with_the_reason(
    moto: MotoBatchServer,
) -> None:
    runner = get_runner(trackers={})
    handle = runner.run(_app(), "aws_batch", {"queue": QUEUE}, stall_timeout=2)
    job_id = _job_id(handle)
    moto.set_status(job_id, "RUNNING")  # play Batch: the job and its two nodes run
    moto.add_node_jobs(job_id, ["RUNNING", "RUNNING"])

    printing = threading.Event()

    def print_lines() -> None:  # node 1 prints a line every 0.3 s until told to stop
        i = 0
        while not printing.wait(0.3):
            moto.put_logs(f"{moto.job(job_id).job_definition.name}/default/node-1", [f"tick {i}"])
            i += 1

    printer = threading.Thread(target=print_lines, daemon=True)
    printer.start()
    try:  # four timeouts of waiting while it prints: never stopped
        status = runner.wait(handle, wait_interval=0.5, timeout=8)
        assert status is not None and status.state == specs.AppState.RUNNING, status
        assert moto.job(job_id).stop is False
    finally:
        printing.set()
        printer.join()

    def play_batch() -> None:  # a terminated job ends FAILED, its reason kept
        if poll_until(lambda: moto.job(job_id).stop, bool, timeout=120):
            moto.set_status(job_id, "FAILED")

    batch = threading.Thread(target=play_batch, daemon=True)
    batch.start()
    status = runner.wait(handle, wait_interval=0.5, timeout=120)
    batch.join()
    reason = "stalled: no progress or output for 2 s (no step reported)"
    assert moto.job(job_id).job_stopped_reason == reason
    assert status is not None and status.state == specs.AppState.FAILED, status
    assert status.msg.startswith(reason), status.msg
    fresh = get_runner(trackers={}).status(handle)  # another process reads it from Batch
    assert fresh is not None and fresh.state == specs.AppState.FAILED
    assert fresh.msg.startswith(reason)


def test_batch_nodes_waiting_for_a_starting_peer_are_not_stopped(moto: MotoBatchServer) -> None:
    """The job reads RUNNING once its main node runs; nodes waiting silently in rendezvous
    for a STARTING peer are not stalled: nothing to judge until every node runs."""
    runner = get_runner(trackers={})
    handle = runner.run(_app(), "aws_batch", {"queue": QUEUE}, stall_timeout=2)
    job_id = _job_id(handle)
    moto.set_status(job_id, "RUNNING")
    moto.add_node_jobs(job_id, ["RUNNING", "STARTING"])
    status = runner.wait(handle, wait_interval=0.5, timeout=6)  # three stall timeouts
    assert status is not None and status.state == specs.AppState.RUNNING, status
    assert moto.job(job_id).stop is False
