"""``torchx reap`` against Airflow's REST API v2 (``GET /api/v2/dags/{dag}/dagRuns/{run}/
taskInstances/{task}[/{map}]``, answers in the documented ``TaskInstanceResponse`` shape)
served by a local HTTP server on a free loopback port (and real local_cwd jobs).

Why a served answer: a real Airflow deployment (``tests/deployments``) takes minutes to
start, and cannot be made to answer 403 for one DAG, 500 once, or change a task's state
between two questions at a chosen moment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.polling import poll_until
from torchx.pipelines.owner import Owner
from torchx.pipelines.reap import Orchestrators, ReapError, Unreachable, find_candidates, reap
from torchx.runner import get_runner

Answer = Tuple[int, Dict[str, str]]  # HTTP status, body


@dataclass
class AirflowAPI:
    """A served Airflow API: ``answers[path]`` is the list of answers for a task instance
    (the last one repeats); every asked path goes to ``asked``."""

    url: str
    answers: Dict[str, List[Answer]] = field(default_factory=dict)
    asked: List[str] = field(default_factory=list)

    def owner(self, dag: str, map_index: object = -1) -> Owner:
        ids = {"dag": dag, "run": "r", "task": "t", "map": map_index, "try": 1}
        return Owner("airflow", ids, self.url)

    def answer(self, dag: str, *answers: Answer) -> None:
        self.answers[f"/api/v2/dags/{dag}/dagRuns/r/taskInstances/t"] = list(answers)


def ti(state: str) -> Answer:
    return 200, {"task_id": "t", "dag_id": "d", "dag_run_id": "r", "state": state}


@pytest.fixture()
def airflow_api() -> Iterator[AirflowAPI]:
    api = AirflowAPI("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            api.asked.append(self.path)
            answers = api.answers.get(self.path)
            if not answers:
                self.send_error(404, "not found")
                return
            code, body = answers.pop(0) if len(answers) > 1 else answers[0]
            if code != 200:
                self.send_error(code)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))  # only this test's apps
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    for name in ("AIRFLOW_API_TOKEN", "AIRFLOW_API_USERNAME", "AIRFLOW_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_owners_http_error_keeps_its_job_only(airflow_api: AirflowAPI) -> None:
    """A 403 or a 500 for one owner says nothing of the orchestrator: the next owner at the
    same URL is asked (and its failed task reaped)."""
    airflow_api.answer("forbidden", (403, {}))
    airflow_api.answer("broken", (500, {}))
    airflow_api.answer("failed", ti("failed"))
    orchestrators = Orchestrators()
    for dag in ("forbidden", "broken"):
        with pytest.raises(ReapError, match="HTTP") as e:
            orchestrators.state(airflow_api.owner(dag))
        assert not isinstance(e.value, Unreachable)
    assert orchestrators.state(airflow_api.owner("failed")) == ("failed", True)


def test_a_401_or_no_connection_marks_the_orchestrator_down(airflow_api: AirflowAPI) -> None:
    """Credentials refused (401) or nothing listening: no owner of that orchestrator can be
    asked, so the rest of the run does not ask it again."""
    airflow_api.answer("refused", (401, {}))
    airflow_api.answer("failed", ti("failed"))
    orchestrators = Orchestrators()
    with pytest.raises(Unreachable, match="HTTP 401"):
        orchestrators.state(airflow_api.owner("refused"))
    with pytest.raises(Unreachable, match="HTTP 401"):
        orchestrators.state(airflow_api.owner("failed"))
    assert not [p for p in airflow_api.asked if "/dags/failed/" in p]
    dead = Owner("airflow", {"dag": "d", "run": "r", "task": "t"}, "http://127.0.0.1:9")
    with pytest.raises(Unreachable, match="cannot reach"):
        orchestrators.state(dead)


def _state(handle: str) -> str:
    with get_runner() as runner:
        status = runner.status(handle)
    return status.state.name if status is not None else ""


def test_a_malformed_owner_is_kept_and_the_run_goes_on(airflow_api: AirflowAPI, home: Path) -> None:
    """An owner whose map index is not a number is kept with one line saying why; the
    other owners are still asked and their orphans reaped (the real CLI)."""
    airflow_api.answer("failed", ti("failed"))
    with get_runner() as runner:
        bad = runner.run_component(
            "utils.sh",
            ["sleep", "600"],
            "local_cwd",
            owner=airflow_api.owner("failed", "x").to_metadata(),
        )
        orphan = runner.run_component(
            "utils.sh",
            ["sleep", "600"],
            "local_cwd",
            owner=airflow_api.owner("failed").to_metadata(),
        )
        try:
            cmd = [sys.executable, "-m", "torchx.cli.main", "reap"]
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ)
            )
            assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
            assert "malformed owner" in out.stderr and "map=x" in out.stderr, out.stderr
            assert f"kept {bad} " in out.stdout and f"cancelled {orphan}" in out.stdout
            assert _state(bad) == "RUNNING"
            state = poll_until(lambda: _state(orphan), lambda s: s == "CANCELLED", 60)
            assert state == "CANCELLED"
        finally:
            for handle in (bad, orphan):
                runner.cancel(handle)


def test_each_owner_is_asked_again_just_before_its_job_is_cancelled(
    airflow_api: AirflowAPI, home: Path
) -> None:
    """Between the listing and the cancel a user may clear the task (its new try
    re-attaches to the live job) or the orchestrator may fail to answer: such a job is
    kept; only an owner that still says it ended for good loses its job."""
    airflow_api.answer("cleared", ti("failed"), ti("running"))
    airflow_api.answer("flaky", ti("failed"), (500, {}))
    airflow_api.answer("failed", ti("failed"))
    with get_runner() as runner:
        handles = {
            dag: runner.run_component(
                "utils.sh",
                ["sleep", "600"],
                "local_cwd",
                owner=airflow_api.owner(dag).to_metadata(),
            )
            for dag in ("cleared", "flaky", "failed")
        }
        try:
            orchestrators = Orchestrators()
            found = find_candidates(runner, ["local_cwd"], orchestrators)
            assert sorted(c.owner.ids["dag"] for c in found if c.orphan) == [
                "cleared",
                "failed",
                "flaky",
            ]
            assert reap(runner, found, orchestrators) == [handles["failed"]]
            verdicts = {c.owner.ids["dag"]: (c.orphan, c.owner_state) for c in found}
            assert verdicts == {
                "cleared": (False, "running"),
                "flaky": (False, "unknown"),
                "failed": (True, "failed"),
            }
            assert "HTTP 500" in str(next(c.error for c in found if c.owner.ids["dag"] == "flaky"))
            assert _state(handles["cleared"]) == _state(handles["flaky"]) == "RUNNING"
            state = poll_until(lambda: _state(handles["failed"]), lambda s: s == "CANCELLED", 60)
            assert state == "CANCELLED"
        finally:
            for handle in handles.values():
                runner.cancel(handle)


def flow_run(state_type: str, name: str) -> Answer:
    """Prefect's ``GET /flow_runs/{id}`` answer (its ``FlowRun`` shape, the state only)."""
    return 200, {"id": "f", "state": {"type": state_type, "name": name}}  # type: ignore[dict-item]


def test_a_prefect_flow_run_left_cancelling_has_its_job_reaped(
    airflow_api: AirflowAPI, home: Path
) -> None:
    """A flow run Prefect leaves ``Cancelling`` for good (a retried run cancelled again: the
    worker never carries the second cancel out) was cancelled by a user: its job is
    reaped, as a ``Cancelled`` one's; a running or ``AwaitingRetry`` one keeps its job."""
    states = {
        "cancelling": flow_run("CANCELLING", "Cancelling"),
        "cancelled": flow_run("CANCELLED", "Cancelled"),
        "running": flow_run("RUNNING", "Running"),
        "awaiting-retry": flow_run("SCHEDULED", "AwaitingRetry"),
    }
    for run, answer in states.items():
        airflow_api.answers[f"/flow_runs/{run}"] = [answer]
    with get_runner() as runner:
        handles = {
            run: runner.run_component(
                "utils.sh",
                ["sleep", "600"],
                "local_cwd",
                owner=Owner("prefect", {"flow_run": run}, airflow_api.url).to_metadata(),
            )
            for run in states
        }
        try:
            orchestrators = Orchestrators()
            found = find_candidates(runner, ["local_cwd"], orchestrators)
            verdicts = {c.owner.ids["flow_run"]: (c.orphan, c.owner_state) for c in found}
            assert verdicts == {
                "cancelling": (True, "Cancelling"),
                "cancelled": (True, "Cancelled"),
                "running": (False, "Running"),
                "awaiting-retry": (False, "AwaitingRetry (SCHEDULED)"),
            }
            cancelled = reap(runner, found, orchestrators)
            assert sorted(cancelled) == sorted([handles["cancelling"], handles["cancelled"]])
            for handle in (handles["cancelling"], handles["cancelled"]):
                state = poll_until(partial(_state, handle), lambda s: s == "CANCELLED", 60)
                assert state == "CANCELLED", handle
            assert _state(handles["running"]) == _state(handles["awaiting-retry"]) == "RUNNING"
        finally:
            for handle in handles.values():
                runner.cancel(handle)
