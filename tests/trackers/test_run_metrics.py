"""What the Runner records on a job's MLflow run besides its start and end, with real
local_cwd jobs and real MLflow (the embedded sqlite store, and one ``mlflow server``):
resource-hours, progress reports at their steps, and a stalled job's reason.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from tests.polling import poll_until
from tests.trackers.test_job_run import the_run
from torchx import specs
from torchx.runner import get_runner
from torchx.runner.resource_hours import ENV_JOB_START_MS, resource_hours
from torchx.runner.tracking import FAILURE_REASON_TAG
from torchx.runtime.progress import PROGRESS_KEYS
from torchx.schedulers import get_scheduler_factories
from torchx.specs.api import parse_app_handle
from torchx.specs.states import is_terminal
from torchx.trackers.mlflow_rest import MlflowRest
from torchx.trackers.mlflow_store import metric_rows

DEADLINE = 300  # generous: the machine is shared; nothing here asserts a time

DDP = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "t = torch.ones(1); dist.all_reduce(t)\n"
    "print('allreduce', int(t.item()), 'of', dist.get_world_size(), flush=True)\n"
    "assert int(t.item()) == dist.get_world_size() == 2\n"
    "dist.destroy_process_group()\n"
)
PROGRESS = (
    "import time; from torchx.trackers import report_progress\n"
    "for i in range(1, 101):\n"
    "    report_progress(i, total=100, loss=1.0 / i); time.sleep(0.1)\n"
)


def _store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uri: str) -> str:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", uri)
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return uri


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "store").mkdir()
    return _store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")


def history(uri: str, run: Any, key: str) -> List[Any]:
    from mlflow import MlflowClient

    return list(MlflowClient(uri).get_metric_history(run.info.run_id, key))


def assert_hours_match_the_run(run: Any, role: str = "") -> None:
    """cpu_hours = requested cpu x replicas x the run's own start-to-end, within the second
    between the Runner's end and the run's end time."""
    p = run.data.params
    role = role or next(k.split(".")[1] for k in p if k.startswith("resources."))
    cpu = float(p[f"resources.{role}.cpu"]) * int(p[f"resources.{role}.replicas"])
    wall_h = (run.info.end_time - run.info.start_time) / 3.6e6
    assert run.data.metrics["cpu_hours"] == pytest.approx(cpu * wall_h, abs=cpu * 2 / 3600)


def test_a_ddp_job_of_two_gloo_ranks_has_cpu_hours_and_no_gpu_hours(
    store: str, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(DDP)
    with get_runner() as runner:
        handle = runner.run_component(
            "dist.ddp", ["-j", "1x2", "--script", "train.py"], "local_cwd"
        )
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status
        lines = list(runner.log_lines(handle, "train", 0))
        hours = runner.resource_hours(handle)
    assert any("allreduce 2 of 2" in line for line in lines), lines
    run = the_run(store, handle)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["cpu_hours"] > 0 and run.data.metrics["gpu_hours"] == 0
    assert hours is not None and hours.cpu_hours == run.data.metrics["cpu_hours"]
    assert run.data.params["resources.train.gpu"] == "0"
    assert_hours_match_the_run(run, "train")


def test_another_runner_that_sees_the_job_running_records_its_hours(store: str) -> None:
    """A re-attaching stage (another process in real life) finds the start in the job's env."""
    with get_runner() as submitter:
        handle = submitter.run_component("utils.sh", ["sleep", "10"], "local_cwd")
    with get_runner() as watcher:
        app = watcher.describe(handle)
        assert app is not None and ENV_JOB_START_MS in app.roles[0].env
        status = watcher.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status
        assert watcher.resource_hours(handle) is not None
    run = the_run(store, handle)
    assert run.data.metrics["cpu_hours"] > 0
    assert_hours_match_the_run(run)
    # a Runner whose first look finds the app ended, after a watcher recorded: adds nothing,
    # and the run keeps the end the watcher gave it
    with get_runner() as late:
        late.status(handle)
        assert late.resource_hours(handle) is None
    after = the_run(store, handle)
    assert len(history(store, after, "cpu_hours")) == 1
    assert (after.info.status, after.info.end_time) == (run.info.status, run.info.end_time)


@pytest.mark.parametrize("over", ["sqlite", "http"])
def test_a_run_whose_watcher_recorded_the_hours_but_could_not_end_it_is_ended_by_a_late_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_http_server: str, over: str
) -> None:
    """The watcher's end failed (store locked, server gone, watcher killed) after it
    recorded cpu_hours: the next Runner that sees the app ended ends the run."""
    from torchx.trackers.mlflow_rest import MlflowRest
    from torchx.trackers.mlflow_sqlite import SqliteStore

    (tmp_path / "store").mkdir()
    uri = (
        f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}" if over == "sqlite" else mlflow_http_server
    )
    _store(tmp_path, monkeypatch, uri)
    store_cls = SqliteStore if over == "sqlite" else MlflowRest

    def fails(*_: Any, **__: Any) -> None:
        raise OSError("database is locked")

    with get_runner() as watcher:
        handle = watcher.run_component("utils.sh", ["true"], "local_cwd")
        with monkeypatch.context() as m:
            m.setattr(store_cls, "terminate", fails)
            status = watcher.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status
    stuck = the_run(uri, handle)
    assert stuck.info.status == "RUNNING" and stuck.data.metrics["cpu_hours"] > 0
    with get_runner() as late:  # `torchx status HANDLE`
        late.status(handle)
        assert late.resource_hours(handle) is None  # the watcher's hours stand
    run = the_run(uri, handle)
    assert run.info.status == "FINISHED" and run.info.end_time
    assert len(history(uri, run, "cpu_hours")) == 1


def test_a_job_nobody_watched_end_gets_its_hours_from_the_first_runner_that_sees_it(
    store: str,
) -> None:
    """Detached (its submitter did not wait): the first Runner to see it ended records the
    hours up to its own look, an upper bound like the run's end time; later looks add none."""
    with get_runner() as submitter:
        handle = submitter.run_component("utils.sh", ["echo", "hi"], "local_cwd")
    _, session, app_id = parse_app_handle(handle)
    sched = get_scheduler_factories()["local_cwd"](session)  # the scheduler, not a Runner
    desc = poll_until(lambda: sched.describe(app_id), lambda d: d is None or is_terminal(d.state))
    assert desc is not None and desc.state == specs.AppState.SUCCEEDED, desc
    with get_runner() as first:
        first.status(handle)
        assert first.resource_hours(handle) is not None
    ended = the_run(store, handle)
    assert ended.info.status == "FINISHED" and ended.info.end_time
    with get_runner() as second:
        second.status(handle)
        assert second.resource_hours(handle) is None
    run = the_run(store, handle)
    assert len(history(store, run, "cpu_hours")) == 1 and run.data.metrics["cpu_hours"] > 0
    assert run.info.end_time == ended.info.end_time  # the first look's end stands


def test_a_job_reporting_progress_has_the_reports_as_metrics_at_their_steps(store: str) -> None:
    with get_runner() as runner:
        handle = runner.run_component("utils.python", ["--c", PROGRESS], "local_cwd")
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status
    run = the_run(store, handle)
    m = run.data.metrics
    assert (m["progress_step"], m["progress_total"]) == (100, 100)
    assert m["loss"] == pytest.approx(0.01) and m["progress_rate"] > 0
    steps = history(store, run, "progress_step")
    assert steps[-1].step == 100 and all(p.value == p.step for p in steps)
    losses = {p.step: p.value for p in history(store, run, "loss")}
    assert all(v == pytest.approx(1.0 / s) for s, v in losses.items()), losses
    assert run.data.metrics["cpu_hours"] > 0


# as on a scheduler without a shared job directory (Kubernetes, AWS Batch): no progress file
TRACKED_PROGRESS = (
    "import os, time\n"
    "os.environ.pop('TORCHX_PROGRESS_FILE')\n"
    "os.environ['TORCHX_PROGRESS_INTERVAL'] = '1'\n"
    "from torchx.trackers import report_progress\n"
    "for i in range(1, 61):\n"
    "    report_progress(i, total=60, loss=1.0 / i); time.sleep(0.25)\n"
)


def assert_a_rank_reports_to_its_tracker_run(uri: str) -> None:
    """A rank with no progress file sends its reports to the job's run from a thread of its
    own; ``Runner.progress`` (``torchx status``) reads them back from there while it runs,
    and the final step is on the run when the app ends."""
    with get_runner() as runner:
        handle = runner.run_component("utils.python", ["--c", TRACKED_PROGRESS], "local_cwd")
        with get_runner() as reader:  # another Runner, as `torchx status` is
            seen = poll_until(
                lambda: reader.progress(handle),
                lambda p: p is not None and 0 < p.step < 60,
                DEADLINE,
                0.2,
            )
        assert seen is not None and seen.from_tracker and seen.total == 60, seen
        assert seen.metrics["loss"] == pytest.approx(1.0 / seen.step)
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status
        _, session, app_id = parse_app_handle(handle)
        path = get_scheduler_factories()["local_cwd"](session).progress_path(app_id)
        assert path is None or not os.path.exists(path)  # nothing went to a file
    run = the_run(uri, handle)
    m = run.data.metrics
    assert (m["progress_step"], m["progress_total"]) == (60, 60), m
    steps = [p.step for p in history(uri, run, "progress_step")]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == 60, steps


def test_without_a_progress_file_a_rank_reports_to_its_tracker_run(store: str) -> None:
    assert_a_rank_reports_to_its_tracker_run(store)


def test_a_stalled_job_run_from_the_cli_ends_failed_with_the_reason_as_a_tag(
    store: str, tmp_path: Path
) -> None:
    code = (
        "from torchx.trackers import report_progress; import time\n"
        "report_progress(1, total=10); time.sleep(300)"
    )
    cli = subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "run", "-s", "local_cwd"]
        + ["--stall_timeout", "5", "utils.python", "--c", code],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert cli.returncode != 0
    assert "stalled" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
    from tests.trackers.test_job_run import job_runs

    (run,) = job_runs(store)
    assert run.info.status == "FAILED"
    reason = run.data.tags[FAILURE_REASON_TAG]
    assert reason == "stalled: no progress or output for 5 s (last step 1)"
    assert run.data.metrics["progress_step"] == 1 and run.data.metrics["cpu_hours"] > 0


def test_over_http_the_same_metrics_and_reason_reach_an_mlflow_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_http_server: str
) -> None:
    url = mlflow_http_server  # tests/trackers/conftest.py: one server for the http tests
    _store(tmp_path, monkeypatch, url)
    code = PROGRESS + "time.sleep(300)\n"
    with get_runner() as runner:
        handle = runner.run_component("utils.python", ["--c", code], "local_cwd", stall_timeout=5)
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.FAILED, status
    run = the_run(url, handle)
    assert run.info.status == "FAILED"
    reason = "stalled: no progress or output for 5 s (last step 100)"
    assert status.msg == run.data.tags[FAILURE_REASON_TAG] == reason
    assert run.data.metrics["progress_step"] == 100 and run.data.metrics["cpu_hours"] > 0
    assert_hours_match_the_run(run)
    with get_runner() as late:  # reads the run over REST: the watcher's hours stand
        late.status(handle)
        assert late.resource_hours(handle) is None
    assert len(history(url, run, "cpu_hours")) == 1
    assert_a_rank_reports_to_its_tracker_run(url)  # by REST both ways, same server


def test_requested_resources_times_replicas_times_wall_time() -> None:
    roles: Dict[str, Any] = {
        "trainer": specs.Role(
            "t", "i", resource=specs.Resource(cpu=4, gpu=2, memMB=1), num_replicas=3
        ),
        "ps": specs.Role("p", "i", resource=specs.Resource(cpu=1, gpu=0, memMB=1), num_replicas=2),
        "unsized": specs.Role("u", "i"),  # NULL_RESOURCE: counts nothing
    }
    hours = resource_hours(list(roles.values()), 1000.0, 1000.0 + 1800)
    assert (hours.cpu_hours, hours.gpu_hours) == (7.0, 3.0)
    assert resource_hours(list(roles.values()), 5.0, 1.0).cpu_hours == 0  # clock skew: 0


@pytest.mark.parametrize("path", ["sqlite", "rest", "mlflow_client"])
def test_after_a_resume_the_report_is_the_newest_not_the_highest_step(
    tmp_path: Path, mlflow_http_server: str, path: str
) -> None:
    """Resumed from a checkpoint, a job reports step 800 after it had reported 1000: the
    report (its time above all, which stall detection reads) is the newest one, alike
    through the sqlite store, REST and the MlflowClient fallback."""
    from torchx.runtime.progress import progress_from_metrics
    from torchx.trackers.mlflow_backend import MLflowTracker
    from torchx.trackers.mlflow_store import ClientStore

    uri = mlflow_http_server if path == "rest" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker(tracking_uri=uri)
    store = ClientStore(lambda: tracker.client) if path == "mlflow_client" else tracker.store
    assert type(store).__name__ == {"sqlite": "SqliteStore", "rest": "MlflowRest"}.get(
        path, "ClientStore"
    )
    run_id = store.create_run(store.experiment_id("resume"), "r", {}, {}, 1_000_000)
    before = {"progress_step": 1000.0, "progress_total": 2000.0, "loss": 0.5}
    store.log_metric_rows(run_id, metric_rows(before, 1_700_000_000_000, 1000))
    after = {"progress_step": 800.0, "progress_total": 2000.0, "loss": 0.7}
    store.log_metric_rows(run_id, metric_rows(after, 1_700_000_600_000, 800))  # ten minutes later
    for by_time in (None, PROGRESS_KEYS):  # every key's history, or the Runner's read
        report = progress_from_metrics(store.latest_metrics(run_id, by_time))
        assert report is not None
        assert (report.step, report.total, report.time) == (800, 2000, 1_700_000_600.0), report
        assert report.metrics == {"loss": 0.7}


@pytest.mark.parametrize("path", ["sqlite", "rest"])
def test_a_read_that_asks_no_key_by_time_reads_mlflows_rows_not_the_histories(
    tmp_path: Path, mlflow_http_server: str, path: str
) -> None:
    """``latest_metrics(run, ())`` (whether a run has a metric: the Runner's hours check,
    KFP's outputs) reads MLflow's own row per key, the highest step's, in one indexed read
    or one request, not every history: after a resume it is the step before it."""
    from torchx.trackers.mlflow_backend import MLflowTracker

    uri = mlflow_http_server if path == "rest" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = MLflowTracker(tracking_uri=uri).store
    run_id = store.create_run(store.experiment_id("rows"), "r", {}, {}, 1_000_000)
    store.log_metric_rows(run_id, metric_rows({"progress_step": 1000.0}, 1_700_000_000_000, 1000))
    store.log_metric_rows(run_id, metric_rows({"progress_step": 800.0}, 1_700_000_600_000, 800))
    assert store.latest_metrics(run_id, ()) == {"progress_step": (1000.0, 1_700_000_000_000)}
    assert store.latest_metrics(run_id)["progress_step"] == (800.0, 1_700_000_600_000)


def test_a_progress_read_over_rest_downloads_no_per_step_metric_history(
    mlflow_http_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's own per-step metrics can be millions of points: the Runner's progress read
    takes the run (MLflow's latest rows) and the progress keys' histories only, and finds
    the report that reading every history finds."""
    from torchx.runtime.progress import progress_from_metrics
    from torchx.trackers.mlflow_rest import API, MlflowRest

    store = MlflowRest(mlflow_http_server)
    run_id = store.create_run(store.experiment_id("per-step"), "r", {}, {}, 1_000_000)
    t0 = 1_700_000_000_000
    rows = [
        {"key": "loss", "value": 1.0 / step, "timestamp": t0 + step * 1000, "step": step}
        for step in range(1, 301)
    ]  # the user's own mlflow.log_metric("loss", ..., step=step) at every step
    store._call("POST", API + "/runs/log-batch", {"run_id": run_id, "metrics": rows})
    report_metrics = {"progress_step": 300.0, "progress_total": 1000.0, "loss": 0.25}
    store.log_metric_rows(run_id, metric_rows(report_metrics, t0 + 300_500, 300))
    every_history = store.latest_metrics(run_id)
    calls: List[Dict[str, Any]] = []
    call = store._call

    def spy(method: str, path: str, body: Any = None) -> Any:
        calls.append({"path": path, **(body or {})})
        return call(method, path, body)

    monkeypatch.setattr(store, "_call", spy)
    latest = store.latest_metrics(run_id, PROGRESS_KEYS)
    histories = [c["metric_key"] for c in calls if c["path"].endswith("/metrics/get-history")]
    assert histories == ["progress_step", "progress_total"], calls
    assert latest == every_history, (latest, every_history)
    report = progress_from_metrics(latest)
    assert report is not None and (report.step, report.total) == (300, 1000), report
    assert report.metrics == {"loss": 0.25}


# 40 reports in ~20 s, at the default send interval (10 s)
FORTY_REPORTS = (
    "import time\n"
    "from torchx.trackers import report_progress\n"
    "for i in range(1, 41):\n"
    "    report_progress(i, total=40, loss=1.0 / i); time.sleep(0.5)\n"
)


def assert_every_report_is_on_the_run_at_its_own_step(uri: str, code: str, steps: int) -> Any:
    """Every report is on the job's run: ``steps`` points of ``loss`` and ``progress_step``,
    each at its own step, at increasing times of their own. Returns the run."""
    with get_runner() as runner:
        handle = runner.run_component("utils.python", ["--c", code], "local_cwd")
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status
        assert runner.progress(handle) is not None  # the file stays for `torchx status`
    run = the_run(uri, handle)
    losses = sorted(history(uri, run, "loss"), key=lambda p: p.step)
    assert [p.step for p in losses] == list(range(1, steps + 1))
    assert all(p.value == pytest.approx(1.0 / p.step) for p in losses)
    times = [p.timestamp for p in losses]
    assert times == sorted(times) and len(set(times)) == steps, times  # their own times
    progress_steps = history(uri, run, "progress_step")
    assert sorted(p.step for p in progress_steps) == list(range(1, steps + 1))  # once each
    return run


def test_a_tracked_job_leaves_every_report_on_its_run(store: str) -> None:
    assert_every_report_is_on_the_run_at_its_own_step(store, FORTY_REPORTS, 40)


def test_what_is_queued_when_the_main_thread_ends_is_sent_before_the_exit(store: str) -> None:
    """No total (so no final report) and a send interval longer than the job: the reports go
    in one batch as the interpreter exits, all of them, not only the file's last one (which
    is what the waiter would fill in)."""
    code = (
        "import os, time\n"
        "os.environ['TORCHX_PROGRESS_INTERVAL'] = '3600'\n"
        "from torchx.trackers import report_progress\n"
        "for i in range(1, 21):\n"
        "    report_progress(i, loss=1.0 / i); time.sleep(0.06)\n"
    )
    assert_every_report_is_on_the_run_at_its_own_step(store, code, 20)


# killed before its first batch left (due in an hour): the run has none of its reports
KILLED_BEFORE_ITS_BATCH = (
    "import os, signal, time\n"
    "os.environ['TORCHX_PROGRESS_INTERVAL'] = '3600'\n"
    "from torchx.trackers import report_progress\n"
    "for i in range(1, 8):\n"
    "    report_progress(i, total=10, loss=1.0 / i); time.sleep(0.1)\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)


@pytest.mark.parametrize("over", ["sqlite", "http"])
def test_a_rank_killed_before_it_sent_its_reports_leaves_its_last_step_filled_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_http_server: str, over: str
) -> None:
    """The waiter sees the app end, finds the run without the progress file's last report,
    and logs it at its own step and time."""
    (tmp_path / "store").mkdir()
    uri = (
        f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}" if over == "sqlite" else mlflow_http_server
    )
    _store(tmp_path, monkeypatch, uri)
    with get_runner() as runner:
        handle = runner.run_component("utils.python", ["--c", KILLED_BEFORE_ITS_BATCH], "local_cwd")
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.FAILED, status
        report = runner.progress(handle)
    assert report is not None and report.step == 7 and not report.from_tracker, report
    run = the_run(uri, handle)
    assert run.info.status == "FAILED"
    (point,) = history(uri, run, "progress_step")  # the rank sent none: the waiter's one
    assert (point.step, point.value, point.timestamp) == (7, 7.0, report.time_ms)
    (loss,) = history(uri, run, "loss")
    assert (loss.step, loss.value) == (7, pytest.approx(1.0 / 7))
    assert run.data.metrics["progress_total"] == 10


@pytest.fixture()
def counting_proxy(mlflow_http_server: str) -> Iterator[Tuple[str, List[bytes]]]:
    """A proxy in front of the shared MLflow server: its url and the body of each
    ``runs/log-batch`` request that went through it."""
    batches: List[bytes] = []

    class Forward(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.endswith("/runs/log-batch"):
                batches.append(body)
            headers = {"Content-Type": self.headers.get("Content-Type") or "application/json"}
            request = urllib.request.Request(
                mlflow_http_server + self.path, body or None, headers, method=self.command
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    status, data = answer.status, answer.read()
            except urllib.error.HTTPError as e:
                status, data = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", batches
    finally:
        server.shutdown()
        server.server_close()


def test_over_http_the_reports_arrive_in_a_few_batches_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counting_proxy: Tuple[str, List[bytes]]
) -> None:
    url, batches = counting_proxy
    _store(tmp_path, monkeypatch, url)
    run = assert_every_report_is_on_the_run_at_its_own_step(url, FORTY_REPORTS, 40)
    progress = [b for b in batches if b"progress_step" in b]
    points = history(url, run, "progress_step")
    span_s = (max(p.timestamp for p in points) - min(p.timestamp for p in points)) / 1000
    # one batch per 10 s interval, the final step's, and what is left at the exit: never
    # one request per report
    assert 1 <= len(progress) <= span_s / 10 + 3 and len(progress) < 10, (len(progress), span_s)


def test_over_http_a_batch_past_the_servers_limit_is_split(
    counting_proxy: Tuple[str, List[bytes]],
) -> None:
    url, batches = counting_proxy
    rest = MlflowRest(url)
    run_id = rest.create_run(rest.experiment_id("torchx-batch-split"), "split", {}, {}, 0)
    rows = [("loss", 1.0 / step, 1_700_000_000_000 + step, step) for step in range(1, 2501)]
    rest.log_metric_rows(run_id, rows)
    assert len(batches) == 3  # 1000 + 1000 + 500: MLflow's limit per request
    from mlflow import MlflowClient

    assert len(MlflowClient(url).get_metric_history(run_id, "loss")) == 2500


@pytest.mark.parametrize("path", ["sqlite", "rest", "mlflow_client"])
def test_a_batch_of_rows_lands_each_at_its_own_step_and_time(
    tmp_path: Path, mlflow_http_server: str, path: str
) -> None:
    """``log_metric_rows`` (what ``log_metrics_batch`` sends): every row at its step and time,
    through the sqlite store, REST and the MlflowClient fallback alike."""
    from mlflow import MlflowClient

    from torchx.trackers.mlflow_backend import MLflowTracker
    from torchx.trackers.mlflow_store import ClientStore

    uri = mlflow_http_server if path == "rest" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker(tracking_uri=uri)
    store = ClientStore(lambda: tracker.client) if path == "mlflow_client" else tracker.store
    run_id = store.create_run(store.experiment_id("batch"), "b", {}, {}, 1_000_000)
    t0 = 1_700_000_000_000
    store.log_metric_rows(run_id, [("loss", 1.0 / s, t0 + s, s) for s in range(1, 31)])
    rows = MlflowClient(uri).get_metric_history(run_id, "loss")
    assert sorted((p.step, p.timestamp) for p in rows) == [(s, t0 + s) for s in range(1, 31)]
