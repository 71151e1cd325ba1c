"""Prefect 3 integration against a real (temporary) Prefect server and real local_cwd jobs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Set

import psutil
import pytest

from tests.pipelines.prefect.reads import flow_run_logs, flow_run_task_runs
from tests.processes import job_processes, wait_for_job_processes

ROOT = Path(__file__).resolve().parents[3]


async def _artifact_keys() -> list:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return [a.key for a in await client.read_artifacts()]


@pytest.mark.slow
def test_reference_flow_completes_with_lineage_and_artifacts(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHX_MLFLOW_UI_URL", "http://127.0.0.1:5999")
    sys.path.insert(0, str(ROOT / "examples" / "pipelines" / "prefect"))
    from reference_flow import reference_flow

    result = reference_flow(base_dir=str(env / "out"), j="1x2", epochs=3, limit=500)
    assert result["test_accuracy"] > 0.3
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"]})[0]
    pipeline = [r for r in tracker.run_ids() if r.startswith("prefect://torchx-reference/")]
    assert len(pipeline) == 1
    pipeline_rid = tracker.mlflow_run_id(pipeline[0])  # type: ignore[attr-defined]
    assert tracker.client.get_run(pipeline_rid).info.status == "FINISHED"  # type: ignore[attr-defined]
    assert sorted(tracker.run_ids(parent_run_id=pipeline[0])) == sorted(
        [result["datapreproc"], result["train"], result["evaluate"]]
    )
    ev = result["evaluate"]
    assert {e.artifact for e in tracker.lineage(ev).upstream(ev)} == {"model", "dataset"}
    keys = asyncio.run(_artifact_keys())
    assert any(k and k.startswith("torchx-replicas-train") for k in keys), keys
    assert any(k and k.startswith("torchx-logs-evaluate") for k in keys), keys
    assert "torchx-mlflow-train" in keys, keys  # stable per stage: Prefect keeps its history
    links = asyncio.run(_artifact_data("torchx-mlflow-train"))
    train_rid = tracker.mlflow_run_id(result["train"])  # type: ignore[attr-defined]
    exp = tracker.client.get_run(train_rid).info.experiment_id  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:5999/#/experiments/{exp}/runs/{train_rid}"
    assert len(links) == 1 and links[0].endswith(f"]({url})"), links  # a markdown link


async def _artifact_data(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return [a.data for a in found]


def test_failing_stage_fails_the_flow_with_the_workers_error(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import TorchXJobFailed, close_pipeline_run, submit, wait

    @flow(on_failure=[close_pipeline_run])
    def failing() -> None:
        wait(submit("utils.python", ["--c", "raise RuntimeError('loss is nan')"]))

    state = failing(return_state=True)
    with pytest.raises(TorchXJobFailed, match="RuntimeError: loss is nan") as e:
        state.result()
    assert e.value.status is not None and str(e.value.status.state) == "FAILED"
    needle = "python/0 RuntimeError: loss is nan"  # streamed into the task log
    assert needle in flow_run_logs(state.state_details.flow_run_id, needle)
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"]})[0]
    pipeline = [r for r in tracker.run_ids() if r.startswith("prefect://failing/")]
    rid = tracker.mlflow_run_id(pipeline[0])  # type: ignore[attr-defined]
    assert tracker.client.get_run(rid).info.status == "FAILED"  # type: ignore[attr-defined]


def test_a_misspelled_run_option_fails_the_stage_and_records_nothing(env: Path) -> None:
    """The error names the key; the flow run holds no stage record for its cancel hook."""
    from prefect import flow

    from torchx.pipelines.prefect import submit
    from torchx.pipelines.prefect.stages import read_stages
    from torchx.specs import InvalidRunConfigException

    @flow
    def misspelled() -> str:
        return submit("utils.sh", ["touch", str(env / "ran")], cfg={"log_dri": str(env)})

    state = misspelled(return_state=True)
    want = r"Unknown run option 'log_dri' \(did you mean 'log_dir'\?\)"
    with pytest.raises(InvalidRunConfigException, match=want):
        state.result()
    assert not (env / "ran").exists()
    assert read_stages(str(state.state_details.flow_run_id)) == []


def test_distinct_stages_get_their_own_apps(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import submit, wait
    from torchx.runner import get_runner

    @flow
    def two_echoes() -> tuple:
        a = submit("utils.echo", ["--msg", "first-stage"])
        b = submit("utils.echo", ["--msg", "second-stage"])
        wait(a)
        wait(b)
        return a, b

    state = two_echoes(return_state=True)
    a, b = state.result()
    assert a != b
    with get_runner() as runner:
        assert sorted(x.app_handle for x in runner.list("local_cwd")) == sorted([a, b])
    logged = flow_run_logs(state.state_details.flow_run_id, "echo/0 second-stage")
    assert logged.count("echo/0 first-stage") == 1
    assert logged.count("echo/0 second-stage") == 1


def test_a_stages_secrets_are_masked_in_the_flow_runs_log_and_artifacts(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import submit, wait

    token, password = "tok-plant-1d7", "up-plant-3e8"
    secret_env = f"HF_TOKEN={token},DB_URL=postgres://u:{password}@db/x"

    @flow
    def shows_its_secrets() -> str:
        handle = submit("utils.sh", ["--env", secret_env, "sh", "-c", "echo t=$HF_TOKEN $DB_URL"])
        wait(handle)
        return handle

    state = shows_its_secrets(return_state=True)
    logged = "\n".join(flow_run_logs(state.state_details.flow_run_id, "sh/0 t="))
    assert "sh/0 t=*** postgres://u:***@db/x" in logged, logged
    from prefect.client.orchestration import get_client

    async def artifacts() -> str:
        async with get_client() as client:
            return repr(await client.read_artifacts())

    shown = logged + asyncio.run(artifacts())
    assert token not in shown and password not in shown


def test_a_stage_written_as_its_torchrun_line(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import run
    from torchx.pipelines.torchrun import torchrun_stage

    @flow
    def torchrun_flow() -> str:
        line = "torchrun --nproc_per_node 2 --no_python sh -c 'echo rank$RANK-says-hi'"
        return run(*torchrun_stage(line))

    state = torchrun_flow(return_state=True)
    handle = state.result()
    assert handle.startswith("local_cwd://torchx/sh-")
    logged = flow_run_logs(state.state_details.flow_run_id, "[1]:rank1-says-hi")
    assert "sh/0 [0]:rank0-says-hi" in logged and "sh/0 [1]:rank1-says-hi" in logged


def test_submit_is_idempotent_per_flow_run_and_key(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import submit, wait
    from torchx.runner import get_runner

    @flow
    def twice() -> tuple:
        first = submit("utils.sh", ["sleep", "1"], key="stage")
        again = submit("utils.sh", ["sleep", "1"], key="stage")  # what a retry of the task does
        wait(again)
        return first, again

    first, again = twice()
    assert first == again
    with get_runner() as runner:
        assert len(runner.list("local_cwd")) == 1


def test_a_retried_flow_run_re_attaches_to_the_stage_that_succeeded(env: Path) -> None:
    """Prefect re-runs every task of a retried flow run.

    The stage that already succeeded is not launched again.
    """
    from prefect import flow

    from torchx.pipelines.prefect import submit, wait
    from torchx.runner import get_runner

    tries: list = []

    @flow(retries=1, retry_delay_seconds=0)
    def flaky() -> list:
        handle = submit("utils.sh", ["echo", "stage done"], key="stage")
        wait(handle)
        tries.append(handle)
        if len(tries) == 1:
            raise RuntimeError("a later stage failed")
        return tries

    state = flaky(return_state=True)
    first, second = state.result()
    assert first == second
    with get_runner() as runner:
        assert [a.app_handle for a in runner.list("local_cwd")] == [first]
    # submit asks the scheduler again (it is never cached: a cancelled app's handle must
    # not come back), which returns the succeeded app; wait's persisted result is reused
    task_runs = flow_run_task_runs(state.state_details.flow_run_id)
    assert [(t.name, t.state.name) for t in task_runs] == [
        ("submit-stage", "Completed"),
        ("wait-sh", "Completed"),  # named after the app without a key=
        ("submit-stage", "Completed"),
        ("wait-sh", "Cached"),
    ]


def test_timeout_of_the_flow_cancels_the_app(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import submit, wait

    handles: list = []

    @flow(timeout_seconds=15)
    def slow() -> None:
        h = submit("utils.sh", ["--num_replicas", "2", "sleep", "600"])
        handles.append(h)
        wait(h)

    with pytest.raises(BaseException):  # noqa: B017 (Prefect's timeout error type varies by version)
        slow()
    from torchx.runner import get_runner

    with get_runner() as runner:
        status = runner.wait(handles[0], timeout=60)
    assert str(status.state) == "CANCELLED"
    time.sleep(0.5)
    assert job_processes(handles[0], ["sleep", "600"]) == []


def test_job_block_trigger_wait_fetch_and_save(env: Path) -> None:
    from torchx.pipelines.prefect import TorchXJob, TorchXJobFailed

    async def go() -> dict:
        job = TorchXJob(component="utils.echo", component_args={"msg": "block"}, key="echo")
        await job.save("torchx-echo", overwrite=True)
        loaded = await TorchXJob.load("torchx-echo")
        assert loaded.component_args == {"msg": "block"} and loaded.key == "echo"
        run = await loaded.trigger()
        await run.wait_for_completion()
        return await run.fetch_result()

    result = asyncio.run(go())
    assert result["state"] == "SUCCEEDED" and result["app_handle"].startswith("local_cwd://")
    assert result["roles"][0]["replicas"][0]["state"] == "SUCCEEDED", result

    async def failing() -> None:
        run = await TorchXJob(component="utils.sh", component_args=["false"]).trigger()
        await run.wait_for_completion()
        await run.fetch_result()

    with pytest.raises(TorchXJobFailed):
        asyncio.run(failing())
    assert "component" in TorchXJob.model_json_schema()["properties"]


def test_job_block_wait_cancelled_cancels_the_app(env: Path) -> None:
    """As the ``wait`` task: a cancelled ``wait_for_completion`` (a flow timeout, a
    cancelled flow run) cancels the app rather than leaving it running."""
    from torchx.pipelines.prefect import TorchXJob
    from torchx.runner import get_runner

    handles: list = []

    async def go() -> None:
        run = await TorchXJob(component="utils.sh", component_args=["sleep", "600"]).trigger()
        handles.append(run.handle)
        wait_for_job_processes(run.handle, 1, ["sleep", "600"])
        await asyncio.wait_for(run.wait_for_completion(), timeout=1)

    loop = asyncio.new_event_loop()  # closed without waiting on the wait's thread
    try:
        with pytest.raises(asyncio.TimeoutError):
            loop.run_until_complete(go())
        with get_runner() as runner:
            status = runner.wait(handles[0], timeout=60)
        assert status is not None and str(status.state) == "CANCELLED"
    finally:  # a failed test leaves no 10-minute app (nor a thread waiting on it) behind
        with get_runner() as runner:
            runner.cancel(handles[0])
        loop.close()


@dataclass
class Served:
    torchx_home: Path
    runner_pid: int


@pytest.fixture(scope="module")
def served(prefect_server: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``served_flow.py`` served by a Prefect runner subprocess (its own ``TORCHX_HOME``)."""
    from prefect.settings import PREFECT_API_URL

    home = tmp_path_factory.mktemp("served") / "home"
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "TORCHX_HOME": str(home),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
    }
    env.pop("TORCHX_TRACKERS", None)
    here = Path(__file__).parent
    proc = subprocess.Popen(
        [sys.executable, "served_flow.py", "served"],
        cwd=here,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield Served(home, proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _new_running_app(known: Set[str], timeout: float = 120) -> str:
    from torchx.runner import get_runner

    deadline = time.monotonic() + timeout
    with get_runner() as runner:
        while time.monotonic() < deadline:
            apps = [a for a in runner.list("local_cwd") if a.app_handle not in known]
            if apps and str(apps[0].state) == "RUNNING":
                return apps[0].app_handle
            time.sleep(0.3)
    raise AssertionError(f"the served flow run started no app within {timeout:.0f} s")


async def _start_served_run(mode: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        deadline = time.monotonic() + 120
        while True:  # the runner registers the deployment once it is up
            try:
                deployment = await client.read_deployment_by_name("torchx-long-job/served")
                break
            except ObjectNotFound:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
        run = await client.create_flow_run_from_deployment(deployment.id, parameters={"mode": mode})
        return str(run.id)


async def _final_state(flow_run_id: str, timeout: float = 120) -> str:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        deadline = time.monotonic() + timeout
        while True:
            state = (await client.read_flow_run(flow_run_id)).state
            if state is not None and state.is_final() or time.monotonic() > deadline:
                return state.type.value if state else "NONE"
            await asyncio.sleep(0.3)


async def _cancel_through_the_api(flow_run_id: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Cancelling(message="cancelled by the test"))


def _kill_flow_run_process(runner_pid: int) -> None:
    """SIGKILL the process in which the runner executes the flow run.

    As an OOM kill or a lost node would. ``flow.serve()`` starts each flow run in a
    ``multiprocessing`` spawn child; one runs at a time here.
    """
    runs = [
        c for c in psutil.Process(runner_pid).children() if "--multiprocessing-fork" in c.cmdline()
    ]
    assert len(runs) == 1, [c.cmdline() for c in runs]
    runs[0].kill()


@pytest.mark.parametrize(
    ("mode", "end", "final"),
    [
        ("wait", "cancel", "CANCELLED"),  # the wait task is interrupted and cancels the app
        ("hook", "cancel", "CANCELLED"),  # the flow is elsewhere: only on_cancellation can
        ("block", "cancel", "CANCELLED"),  # the same for an app triggered by a TorchXJob block
        (
            "hook",
            "kill",
            "CRASHED",
        ),  # the flow-run process is SIGKILLed: on_crashed cancels the app
    ],
)
def test_ending_a_served_flow_run_ends_its_app(
    served: Served, monkeypatch: pytest.MonkeyPatch, mode: str, end: str, final: str
) -> None:
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_HOME", str(served.torchx_home))
    with get_runner() as runner:
        known = {a.app_handle for a in runner.list("local_cwd")}
    flow_run_id = asyncio.run(_start_served_run(mode))
    handle = _new_running_app(known)
    try:
        procs = wait_for_job_processes(handle, 2, ["sleep", "600"])
        if end == "cancel":
            asyncio.run(_cancel_through_the_api(flow_run_id))
        else:
            _kill_flow_run_process(served.runner_pid)
        assert asyncio.run(_final_state(flow_run_id)) == final
        with get_runner() as runner:
            status = runner.wait(handle, timeout=60)
        assert status is not None and str(status.state) == "CANCELLED"
        _, alive = psutil.wait_procs(procs, timeout=30)
        assert alive == [], f"still running after the flow run ended: {alive}"
    finally:  # a failed test leaves no 10-minute app behind
        with get_runner() as runner:
            runner.cancel(handle)
