"""The ray scheduler against a real local Ray head (loopback only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import List, Optional

import psutil
import pytest

from tests.mlflow_server import free_port
from tests.polling import poll_until
from tests.processes import wait_for_job_processes
from torchx import specs
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, OWNER, DescribeAppResponse, idempotency_token
from torchx.schedulers.ray_driver import REQUEST_ENV
from torchx.schedulers.ray_scheduler import RayScheduler, create_scheduler

ROOT = Path(__file__).resolve().parents[3]
BIN = os.path.dirname(sys.executable)
TORCHX = os.path.join(BIN, "torchx")

pytestmark = pytest.mark.ray


def _tx(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TORCHX, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )


def test_logs_status_list_and_failure(env: Path) -> None:
    ok = _tx(
        "run",
        "-s",
        "ray",
        "--wait",
        "--log",
        "utils.sh",
        "--num_replicas",
        "2",
        "sh",
        "-c",
        "echo hi from $TORCHX_RANK0_HOST",
    )
    assert ok.returncode == 0, ok.stderr
    assert "sh/0 hi from 127.0.0.1" in ok.stdout and "sh/1 hi from 127.0.0.1" in ok.stdout
    handle = ok.stdout.splitlines()[0]
    assert "State: SUCCEEDED" in _tx("status", handle).stdout
    assert handle in _tx("list", "-s", "ray").stdout
    assert _tx("log", f"{handle}/sh/1").stdout == "sh/1 hi from 127.0.0.1\n"
    bad = _tx(
        "run",
        "-s",
        "ray",
        "--wait",
        "utils.python",
        "--num_replicas",
        "2",
        "--c",
        "raise SystemExit(3)",
    )
    assert bad.returncode == 1 and "FAILED" in bad.stderr
    status = _tx("status", "--json", bad.stdout.splitlines()[0]).stdout
    assert '"state": "FAILED"' in status


def test_cancel_stops_every_replica_process(env: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    handle = _tx(
        "run", "-s", "ray", "utils.sh", "--num_replicas", "2", "sleep", "600"
    ).stdout.splitlines()[0]
    sleeps = wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=120)
    assert _tx("cancel", handle).returncode == 0
    _, alive = psutil.wait_procs(sleeps, timeout=60)
    assert alive == []
    assert "CANCELLED" in _tx("status", handle).stdout
    # A driver that starts after Ray stopped its job (a stop while the job was PENDING
    # can kill the entrypoint's shell just before it starts the driver: seen in CI, the
    # orphan held the head's CPUs) runs no replica. Its request is the job's, from Ray.
    app_id = specs.parse_app_handle(handle).app_id.split("-", 1)[1]  # less host:port-
    info = JobSubmissionClient(os.environ["RAY_API_SERVER_ADDRESS"]).get_job_info(app_id)
    driver = subprocess.Popen(
        [sys.executable, "-m", "torchx.schedulers.ray_driver"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, **{REQUEST_ENV: info.runtime_env["env_vars"][REQUEST_ENV]}),
    )
    try:
        out, _ = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, 9)
    assert driver.returncode == 143 and "already ended this job" in out, out


def test_a_driver_that_cannot_ask_ray_runs_its_job() -> None:
    """Doubt is not an end: a dashboard the driver cannot reach (an address only the
    submitter can reach) leaves the job to run."""
    from torchx.schedulers.ray_driver import ended_by_ray

    assert not ended_by_ray({"address": f"127.0.0.1:{free_port()}", "app_id": "app-1"})
    assert not ended_by_ray({"app_id": "app-1"})


def _true_app(token: str) -> specs.AppDef:
    role = specs.Role(
        "r", image="", entrypoint="true", resource=specs.Resource(cpu=1, gpu=0, memMB=64)
    )
    return specs.AppDef("idem", [role], metadata={IDEMPOTENCY_TOKEN: token})


def test_token_in_job_metadata_found_oldest_first_from_any_home(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = create_scheduler("test")
    t1, t2 = idempotency_token("dag/task/run-1"), idempotency_token("dag/task/run-2")
    first = sched.submit(_true_app(t1), {})
    second = sched.submit(_true_app(t1), {})
    other = sched.submit(_true_app(t2), {})
    try:
        found = sched.find_by_idempotency_token(t1)
        assert [(a.app_id, a.name) for a in found] == [(first, "idem"), (second, "idem")]
        assert [a.app_id for a in sched.find_by_idempotency_token(t2)] == [other]
        assert sched.find_by_idempotency_token(idempotency_token("never used")) == []
        assert {first, second, other} <= {a.app_id for a in sched.list()}
        # Nothing is written to the submitter's disk: the request travels with the job.
        assert not (env / "home" / "ray").exists()
        # Another process with its own $TORCHX_HOME finds the same apps, through Ray alone.
        monkeypatch.setenv("TORCHX_HOME", str(env / "other-home"))
        elsewhere = create_scheduler("elsewhere")
        assert [a.app_id for a in elsewhere.find_by_idempotency_token(t1)] == [first, second]
    finally:
        pending = {first, second, other}
        for app_id in pending:  # the apps only had to exist: free the head's CPUs
            sched.cancel(app_id)
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            live = {a.app_id for a in sched.list() if not specs.is_terminal(a.state)}
            pending &= live
            time.sleep(0.5)
        assert not pending, f"jobs still running after 120 s: {pending}"


def test_owner_and_token_in_job_metadata_come_back_from_describe_on_ray(env: Path) -> None:
    from torchx.pipelines.owner import owner_of
    from torchx.pipelines.reap import Orchestrators, find_candidates
    from torchx.runner import get_runner

    owner = '{"kind":"kfp","run":"run 1 | 100% \u00fc","task":"train \\"a\\""}'
    want = {OWNER: owner, IDEMPOTENCY_TOKEN: idempotency_token("ray-owner")}
    res = specs.Resource(cpu=1, gpu=0, memMB=64)
    app = specs.AppDef("own", [specs.Role("r", "", entrypoint="sleep", args=["600"], resource=res)])
    with get_runner() as runner:
        handle = runner.run(app, "ray", {}, idempotency_key="ray-owner", owner=owner)
        try:
            described = get_runner().describe(handle)  # from Ray, not this runner's cache
            assert described is not None and described.metadata == want
            candidates = find_candidates(get_runner(), ["ray"], Orchestrators())
            found = [c for c in candidates if c.handle == handle]
            assert len(found) == 1 and found[0].owner == owner_of(want)
        finally:
            runner.cancel(handle)
        plain = runner.run(_true_app(""), "ray", {})
        described = get_runner().describe(plain)
        assert described is not None and described.metadata == {}
        assert runner.wait(plain, wait_interval=0.5, timeout=120) is not None


def test_a_dashboard_address_option_is_used_without_touching_os_environ(
    env: Path, ray_head: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's client prefers $RAY_API_SERVER_ADDRESS/$RAY_ADDRESS to its argument: with both
    naming a dead address, a submit to the head named by ``dashboard_address`` still lands
    there, and the process's environment (other threads read it) is never written."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(f"http://{ray_head}")  # the env fixture names the head
    nowhere = f"http://127.0.0.1:{free_port()}"
    with monkeypatch.context() as patched:
        patched.setenv("RAY_API_SERVER_ADDRESS", nowhere)
        patched.setenv("RAY_ADDRESS", nowhere)
        patched.setattr(os, "environ", MappingProxyType(dict(os.environ)))  # a write raises
        app_id = create_scheduler("t").submit(_true_app(""), {"dashboard_address": ray_head})
    assert app_id.startswith(f"{ray_head}-"), app_id  # the address it went to
    job_id = app_id[len(ray_head) + 1 :]
    ended = ("SUCCEEDED", "FAILED", "STOPPED")
    status = poll_until(lambda: str(client.get_job_status(job_id).value), ended.__contains__, 120)
    assert status == "SUCCEEDED"


def _no_ray_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


def test_a_handle_works_from_a_shell_with_no_ray_env(env: Path, ray_head: str) -> None:
    """The handle carries the dashboard it went to (upstream's ``<host:port>-<job id>``):
    ``status``, ``log`` and ``describe`` from another process with no ``RAY_*`` variable
    reach the job; a handle of the old form (no address) still reads the environment's."""
    run = _tx("run", "-s", "ray", "--wait", "utils.sh", "sh", "-c", "echo from $TORCHX_JOB_ID")
    assert run.returncode == 0, run.stderr
    handle = run.stdout.splitlines()[0]
    assert handle.startswith(f"ray://torchx/{ray_head}-"), handle

    def tx(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [TORCHX, *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(_no_ray_env(), **env),
        )

    status = tx("status", handle)
    assert status.returncode == 0 and "State: SUCCEEDED" in status.stdout, status.stderr
    assert tx("log", f"{handle}/sh/0").stdout == f"sh/0 from {handle}\n"  # $TORCHX_JOB_ID
    assert '"state": "SUCCEEDED"' in tx("status", "--json", handle).stdout
    old = handle.replace(f"ray://torchx/{ray_head}-", "ray://torchx/")
    assert tx("status", old).returncode != 0  # the old form: the default address, no head
    there = tx("status", old, RAY_API_SERVER_ADDRESS=f"http://{ray_head}")
    assert there.returncode == 0 and "State: SUCCEEDED" in there.stdout, there.stderr


def test_old_and_new_app_ids_parse() -> None:
    from torchx.schedulers.ray_scheduler import _app_id, _split

    assert _split("127.0.0.1:8300-train-ab12cd34") == ("http://127.0.0.1:8300", "train-ab12cd34")
    assert _split("ray-head.ns.svc:8265-t-1") == ("http://ray-head.ns.svc:8265", "t-1")
    assert _split("[::1]:8265-t-1") == ("http://[::1]:8265", "t-1")
    assert _app_id("http://127.0.0.1:8300", "t-1") == "127.0.0.1:8300-t-1"
    assert _app_id("127.0.0.1:8300", "t-1") == "127.0.0.1:8300-t-1"
    assert _app_id("https://ray.example.com", "t-1") == "t-1"  # no "//" in a handle
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "environ", env)
        assert _split("train-ab12cd34") == ("http://127.0.0.1:8265", "train-ab12cd34")
        env["RAY_API_SERVER_ADDRESS"] = "http://10.0.0.5:8265"
        assert _split("train-ab12cd34") == ("http://10.0.0.5:8265", "train-ab12cd34")


def test_a_request_larger_than_the_cluster_is_refused_in_one_line_at_submit(env: Path) -> None:
    """dist.ddp asks 2 CPUs a replica: 2x1 is 4 CPUs on a head of 2, which Ray would leave
    PENDING (RUNNING to torchx) for ever. Nothing is submitted."""
    before = {a.app_id for a in create_scheduler("t").list()}
    run = _tx("run", "-s", "ray", "dist.ddp", "-j", "2x1", "--script", "train.py")
    assert run.returncode == 1 and run.stdout == "", (run.stdout, run.stderr)
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith("torchx: error: the Ray cluster at "), run.stderr
    assert "can never place" in error and "4 CPU in all" in error and "2 CPU in all" in error
    assert "Traceback" not in run.stderr
    assert {a.app_id for a in create_scheduler("t").list()} == before


def test_a_scheduler_makes_one_client_per_head(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's client asks the head for its version (twice) when it is made: a poller's
    scheduler (a triggerer lists every poll) makes one client per head, not one per call."""
    from ray.dashboard.modules.dashboard_sdk import SubmissionClient

    checked: List[SubmissionClient] = []  # held, so that no two share an id
    check = SubmissionClient._check_connection_and_version

    def counted(client: SubmissionClient, *args: object, **kwargs: object) -> object:
        checked.append(client)
        return check(client, *args, **kwargs)

    monkeypatch.setattr(SubmissionClient, "_check_connection_and_version", counted)
    sched = create_scheduler("t")
    sched.list()
    sched.list()
    assert sched.describe("no-such-job") is None
    assert len({id(client) for client in checked}) == 1


@pytest.mark.slow
def test_reference_stages_on_ray(env: Path) -> None:
    comp = f"{ROOT}/examples/components.py"
    data, model, ev = env / "data", env / "model", env / "eval"
    steps = [
        [f"{comp}:datapreproc", "--output_path", str(data), "--limit", "600"],
        [
            f"{comp}:trainer",
            "--data_path",
            str(data),
            "--output_path",
            str(model),
            "--checkpoint_path",
            str(env / "ckpt"),
            "-j",
            "2x1",
            "--epochs",
            "3",
            "--rdzv_port",
            "29851",
        ],
        [
            f"{comp}:evaluate",
            "--model_path",
            str(model),
            "--data_path",
            str(data),
            "--output_path",
            str(ev),
        ],
    ]
    for step in steps:
        p = _tx("run", "-s", "ray", "--wait", "--log", *step)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    assert (ev / "metrics.json").exists()
    assert specs.AppState.SUCCEEDED.name in _tx("status", p.stdout.splitlines()[0]).stdout


def test_a_placeable_request_that_waits_is_pending_with_rays_reason(env: Path) -> None:
    """A request the head can hold, but not now (another job holds its CPUs): PENDING while
    its placement group waits, with Ray's reason, not RUNNING."""
    res = specs.Resource(cpu=2, gpu=0, memMB=64)
    role = specs.Role("r", image="", entrypoint="sleep", args=["600"], resource=res)
    sched = create_scheduler("t")
    holder = sched.submit(specs.AppDef("holder", [role]), {})
    waiter = ""
    try:
        running = poll_until(
            lambda: sched.describe(holder),
            lambda d: d is not None and d.state == specs.AppState.RUNNING,
            120,
            0.5,
        )
        assert running and running.state == specs.AppState.RUNNING
        waiter = sched.submit(specs.AppDef("waiter", [role]), {})
        desc = poll_until(
            lambda: sched.describe(waiter),
            lambda d: d is not None and "waiting for resources" in d.msg,
            120,
        )
        assert desc is not None and desc.state == specs.AppState.PENDING, desc
        assert "[2 CPU]" in desc.msg, desc.msg
    finally:
        for app_id in (holder, waiter):
            if app_id:
                sched.cancel(app_id)
        for app_id in (holder, waiter):
            if app_id:
                ended = _ended(sched, app_id)
                assert ended is None or specs.is_terminal(ended.state), ended


def _ended(sched: RayScheduler, app_id: str) -> Optional[DescribeAppResponse]:
    def done(d: Optional[DescribeAppResponse]) -> bool:
        return d is None or specs.is_terminal(d.state)

    return poll_until(lambda: sched.describe(app_id), done, 120, 0.5)
