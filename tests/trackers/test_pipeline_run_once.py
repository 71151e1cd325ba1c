"""One pipeline run per orchestrator pipeline run, however many stages open it at once
(a mapped Airflow task, a Prefect ``.map``), on sqlite and on a real ``mlflow server``;
and its close sums its stages' hours in a few requests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

from torchx.pipelines.core import close_pipeline_run, open_pipeline_run
from torchx.trackers.api import JobRun
from torchx.trackers.mlflow_backend import MlflowBackend

THREADS, PROCESSES, STAGES = 20, 8, 30
DEADLINE = 180.0

# a process: says it is ready, waits for "go", opens the pipeline run and a stage under it
OPEN = """
import os, sys, time
from pathlib import Path
from torchx.pipelines.core import open_pipeline_run
from torchx.trackers.api import JobRun
from torchx.trackers.mlflow_backend import MlflowBackend
uri, pipeline, where, i = sys.argv[1:5]
backend = MlflowBackend("mlflow", uri)
backend.tracker().store  # the store (and its schema check) before the race
Path(where, f"ready-{i}").touch()
while not Path(where, "go").exists():
    time.sleep(0.001)
open_pipeline_run(pipeline, {"mlflow": uri})
print(backend.open_job_run(JobRun(f"stage-{i}", {}, parent_run_id=pipeline)).run_id)
"""


@pytest.fixture()
def sqlite_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "store").mkdir()
    _clean_env(tmp_path, monkeypatch)
    return f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"


@pytest.fixture()
def http_uri(mlflow_http_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    _clean_env(tmp_path, monkeypatch)
    return mlflow_http_server


def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(params=["sqlite", "http"])
def uri(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_uri"))


def all_runs(uri: str, tag: str, value: str) -> List[Any]:
    """Every run (deleted ones too) whose ``tag`` is ``value``."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    flt = f"tags.`{tag}` = '{value}'"
    return list(client.search_runs(exps, flt, run_view_type=ViewType.ALL, max_results=1000))


def check_one_pipeline_run(uri: str, pipeline: str, stage_runs: List[str]) -> None:
    runs = all_runs(uri, "torchx.job_id", pipeline)
    active = [r for r in runs if r.info.lifecycle_stage == "active"]
    assert len(active) == 1, f"active runs of {pipeline}: {[r.info for r in active]}"
    winner = active[0].info.run_id
    running = [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    assert running == [winner], f"left RUNNING besides {winner}: {running}"
    assert "mlflow.parentRunId" not in active[0].data.tags  # a top-level run
    assert active[0].data.tags["torchx.kind"] == "pipeline"
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    parents = {client.get_run(r).data.tags.get("mlflow.parentRunId") for r in stage_runs}
    assert parents == {winner}


def test_threads_opening_a_pipeline_run_at_once_make_one(uri: str) -> None:
    pipeline, barrier = "airflow://team_sweep/sweep1", threading.Barrier(THREADS)
    stages: Dict[int, str] = {}
    errors: List[BaseException] = []

    def stage(i: int) -> None:
        try:
            backend = MlflowBackend("mlflow", uri)
            backend.tracker().store  # noqa: B018  the store before the race
            barrier.wait(timeout=DEADLINE)
            open_pipeline_run(pipeline, {"mlflow": uri})
            job = JobRun(f"stage-{i}", {}, parent_run_id=pipeline)
            stages[i] = backend.open_job_run(job).run_id
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=stage, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DEADLINE)
    assert not errors, errors
    assert len(stages) == THREADS
    check_one_pipeline_run(uri, pipeline, list(stages.values()))


def test_processes_opening_a_pipeline_run_at_once_make_one(uri: str, tmp_path: Path) -> None:
    pipeline, where = "prefect://sweep/run-8", tmp_path / "sync"
    where.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, uri, pipeline, str(where), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for i in range(PROCESSES)
    ]
    try:
        deadline = time.monotonic() + DEADLINE
        while len(list(where.glob("ready-*"))) < PROCESSES:
            assert time.monotonic() < deadline, "processes not ready"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        (where / "go").touch()
        outs = [p.communicate(timeout=DEADLINE) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    check_one_pipeline_run(uri, pipeline, [o[0].strip() for o in outs])


@pytest.fixture()
def count_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[List[str]]:
    """Every HTTP request this process makes (torchx's REST client and MLflow's own)."""
    import requests

    seen: List[str] = []
    request: Callable[..., Any] = requests.Session.request

    def counted(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(f"{method} {url}")
        return request(self, method, url, *args, **kwargs)

    monkeypatch.setattr(requests.Session, "request", counted)
    yield seen


def test_closing_a_pipeline_of_30_stages_takes_a_few_requests(
    http_uri: str, count_requests: List[str]
) -> None:
    pipeline = "airflow://sum/run-30"
    open_pipeline_run(pipeline, {"mlflow": http_uri})
    backend = MlflowBackend("mlflow", http_uri)
    for i in range(STAGES):
        run_id = backend.open_job_run(JobRun(f"stage-{i}", {}, parent_run_id=pipeline)).run_id
        backend.bind_job_run(run_id, f"local_cwd://torchx/stage-{i}")
        backend.log_job_run(run_id, {"cpu_hours": 0.25, "gpu_hours": 0.5}, 0, {})
        backend.close_job_run(f"local_cwd://torchx/stage-{i}", run_id, "FINISHED")
    count_requests.clear()
    hours = close_pipeline_run(pipeline, {"mlflow": http_uri}, "FINISHED")
    made = list(count_requests)
    assert hours is not None and hours.cpu_hours == pytest.approx(7.5)
    assert hours.gpu_hours == pytest.approx(15.0)
    print(f"close_pipeline_run of {STAGES} stages: {len(made)} requests: {made}")
    assert len(made) <= 8, made  # end: 3; the stages: 2; the pipeline run: 2; its sums: 1
    (run,) = [r for r in all_runs(http_uri, "torchx.job_id", pipeline)]
    assert run.info.status == "FINISHED"
    assert run.data.metrics["cpu_hours"] == pytest.approx(7.5)


def test_a_total_that_cannot_be_computed_is_a_warning(
    sqlite_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = "airflow://sum/run-missing"
    open_pipeline_run(pipeline, {"mlflow": sqlite_uri})
    backend = MlflowBackend("mlflow", sqlite_uri)
    for i, hours in enumerate([{"cpu_hours": 1.0}, {}]):
        run_id = backend.open_job_run(JobRun(f"stage-{i}", {}, parent_run_id=pipeline)).run_id
        backend.log_job_run(run_id, hours, 0, {})
    total = close_pipeline_run(pipeline, {"mlflow": sqlite_uri}, "FINISHED")
    assert total is not None and total.cpu_hours == pytest.approx(1.0)
    assert "1 of the 2 stage runs" in caplog.text
