"""A real Airflow 3 deployment on this machine, for tests that need one.

    with airflow_deployment(tmp_path, dags_folder, env) as af:
        af.unpause("my_dag")
        run_id = af.trigger("my_dag")
        af.wait_task(("my_dag", run_id, "job"), {"success"})

A migrated database (``tests.airflow_db``), then ``api-server``, ``scheduler`` (LocalExecutor),
``dag-processor`` and ``triggerer`` as separate processes on sqlite, each in its own
process group, on free loopback ports, with the simple auth manager; driven through the
REST API v2. ``env`` (torchx's settings: ``TORCHX_HOME``, trackers) goes to every process.
Every process group is stopped at the end (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from tests.airflow_db import copy_migrated_db
from tests.mlflow_server import free_port

START_TIMEOUT = 240.0  # healthy after 27-38 s on a quiet 2-core machine
API_RETRY = 30.0
LOCK_WAIT = 60.0  # s a background process waits for the sqlite write lock
HEARTBEAT_TIMEOUT = 15  # [scheduler] task_instance_heartbeat_timeout: bounds crash recovery
PROCESSES = ("api-server", "scheduler", "dag-processor", "triggerer")
TaskId = Tuple[str, str, str]  # dag_id, run_id, task_id
# seconds between checks that call the REST API: each call costs the api-server CPU that the
# processes being waited for need (at 20 ms it took ~20 s of CPU per module)
REST_EVERY = 0.5


class AirflowDeployment:
    """The running deployment: its processes, its REST API, its files."""

    def __init__(self, home: Path, env: Dict[str, str], cwd: Path) -> None:
        self.home = home
        self.env = env
        self.cwd = cwd
        self.url = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}"
        self.procs: Dict[str, subprocess.Popen[bytes]] = {}
        self._token: Optional[str] = None

    # ------------------------------------------------------------------ processes

    def start(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``airflow <name>`` in its own process group, logging to ``<home>/<name>.log``."""
        airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
        # the api-server reads the task logs from this machine's files; a log server would
        # bind every interface (it has no host setting)
        serve = ["--skip-serve-logs"] if name in ("scheduler", "triggerer") else []
        env = dict(self.env)
        if name != "api-server":
            # four processes write one sqlite file. pysqlite waits 5 s for its lock, then
            # raises "database is locked": the scheduler exited on that in a loaded CI run.
            # The api-server keeps the 5 s: two of its own requests can wait on each other
            # (one holds the lock in its event loop), and only the error frees them.
            conn = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"{conn}?timeout={LOCK_WAIT:.0f}"
        with open(self.home / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [airflow, name, *serve],
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def stop(self, name: str, timeout: float = 30) -> None:
        """SIGTERM ``name``'s process group; SIGKILL what is left after ``timeout`` s."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def stop_all(self, timeout: float = 15) -> None:
        """SIGTERM every process group at once, SIGKILL what is left after ``timeout`` s: a
        throwaway deployment needs no orderly stop (one by one, a process waiting on
        another's answer used up 30 s each)."""
        procs, self.procs = list(self.procs.values()), {}
        for proc in procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in procs:
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    # ------------------------------------------------------------------ REST API

    def _login(self) -> str:
        users = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        body = {"username": "admin", "password": users["admin"]}
        token = self._call("POST", "/auth/token", body, auth=False)["access_token"]
        return str(token)

    def api(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        """Call ``/api/v2<path>`` as the admin user; the JSON answer (or the text)."""
        if self._token is None:
            self._token = self._login()
        return self._call(method, "/api/v2" + path, body)

    def _call(
        self, method: str, path: str, body: Optional[Mapping[str, Any]], auth: bool = True
    ) -> Any:
        """One request; a "Database error" (sqlite locked by another process: the API
        rolled the request back) is tried again for up to ``API_RETRY`` s."""
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + API_RETRY
        while True:
            request = urllib.request.Request(self.url + path, data=data, method=method)
            request.add_header("Content-Type", "application/json")
            if auth and self._token:
                request.add_header("Authorization", f"Bearer {self._token}")
            try:
                with urllib.request.urlopen(request, timeout=60) as r:
                    text = r.read().decode()
                break
            except urllib.error.HTTPError as e:
                error = f"{method} {path}: {e.code} {e.read().decode()[:500]}"
                if e.code != 500 or "Database error" not in error or time.monotonic() > deadline:
                    raise AssertionError(error) from None
                time.sleep(0.5)
        try:
            return json.loads(text)
        except ValueError:
            return text

    def healthy(self) -> bool:
        try:
            health = self._call("GET", "/api/v2/monitor/health", None, auth=False)
        except (AssertionError, OSError):
            return False
        return all(
            (health.get(c) or {}).get("status") == "healthy"
            for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")
        )

    def unpause(self, dag_id: str, timeout: float = 120) -> None:
        """Wait until the dag-processor parsed ``dag_id``, then unpause it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api("GET", f"/dags/{dag_id}")
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: Optional[Mapping[str, Any]] = None) -> str:
        run = self.api(
            "POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}}
        )
        return str(run["dag_run_id"])

    def task(self, ti: TaskId) -> Dict[str, Any]:
        dag_id, run_id, task_id = ti
        run = urllib.parse.quote(run_id, safe="")
        return dict(self.api("GET", f"/dags/{dag_id}/dagRuns/{run}/taskInstances/{task_id}"))

    def wait_task(
        self, ti: TaskId, states: Iterable[str], timeout: float = 120, **fields: Any
    ) -> Dict[str, Any]:
        """Poll the task instance until its state is one of ``states`` (and each of
        ``fields`` has the given value, e.g. ``try_number=2``); fail at the deadline."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            found = self.task(ti)
            if found["state"] in wanted and all(found.get(k) == v for k, v in fields.items()):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{ti} not {sorted(wanted)} {fields} within {timeout:.0f} s: "
                    f"state {found['state']}, try {found.get('try_number')}; "
                    f"{self._diagnosis(ti)}"
                )
            time.sleep(0.3)

    def dag_run(self, ti: TaskId) -> Dict[str, Any]:
        """The DAG run of the task instance ``ti``."""
        dag_id, run_id, _ = ti
        run = urllib.parse.quote(run_id, safe="")
        return dict(self.api("GET", f"/dags/{dag_id}/dagRuns/{run}"))

    def wait_dag_run(
        self, ti: TaskId, states: Iterable[str], timeout: float = 120
    ) -> Dict[str, Any]:
        """Poll the DAG run of ``ti`` until its state is one of ``states``; fail at the
        deadline (e.g. the scheduler marks a run whose tasks all succeeded ``success``
        one loop after the last task ended)."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            found = self.dag_run(ti)
            if found["state"] in wanted:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the DAG run of {ti} not {sorted(wanted)} within {timeout:.0f} s: "
                    f"{self._diagnosis(ti)}"
                )
            time.sleep(0.3)

    def _diagnosis(self, ti: TaskId) -> str:
        """What a failed wait needs: the DAG run's state and the scheduler's last lines."""
        try:
            run = self.dag_run(ti)
            state = f"DAG run {run.get('state')} (queued_at {run.get('queued_at')})"
        except (AssertionError, OSError) as e:
            state = f"DAG run unknown ({e})"
        return f"{state}\n--- {self.home / 'scheduler.log'} (last lines):\n{self.log_tail()}"

    def log_tail(self, name: str = "scheduler", lines: int = 30) -> str:
        """The last ``lines`` lines of ``<home>/<name>.log``."""
        path = self.home / f"{name}.log"
        if not path.exists():
            return "(no log)"
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 64 * 1024))
            tail = f.read().decode(errors="replace").splitlines()[-lines:]
        return "\n".join(tail)

    def set_state(self, ti: TaskId, state: str) -> None:
        """Mark the task instance ``failed`` / ``success``, as a user does in the UI."""
        dag_id, run_id, task_id = ti
        run = urllib.parse.quote(run_id, safe="")
        self.api(
            "PATCH",
            f"/dags/{dag_id}/dagRuns/{run}/taskInstances/{task_id}",
            {"new_state": state},
        )

    def clear(self, ti: TaskId) -> None:
        """Clear the task instance (run it again), as a user does in the UI."""
        dag_id, run_id, task_id = ti
        body = {"dry_run": False, "dag_run_id": run_id, "task_ids": [task_id], "only_failed": False}
        self.api("POST", f"/dags/{dag_id}/clearTaskInstances", body)

    def log(self, ti: TaskId, try_number: int) -> str:
        """The task's log of one try, as text."""
        dag_id, run_id, task_id = ti
        run = urllib.parse.quote(run_id, safe="")
        found = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run}/taskInstances/{task_id}/logs/{try_number}"
            "?full_content=true",
        )
        if isinstance(found, dict):
            content = found.get("content", "")
            if isinstance(content, list):
                return "\n".join(
                    str(c.get("event", c)) if isinstance(c, dict) else str(c) for c in content
                )
            return str(content)
        return str(found)

    def logs_so_far(self, ti: TaskId) -> str:
        """Every try's log so far, oldest first, each headed ``--- try N``. A try Airflow
        numbered but whose log it cannot serve (404: the task instance moved on between the
        two reads) reads empty; a loaded machine can make Airflow retry a try."""
        tries = max(1, int(self.task(ti).get("try_number") or 1))
        parts = []
        for n in range(1, tries + 1):
            try:
                parts.append(f"--- try {n}\n{self.log(ti, n)}")
            except AssertionError as e:
                if ": 404 " not in str(e):
                    raise
                parts.append(f"--- try {n}: {e}")
        return "\n".join(parts)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def deployment_env(home: Path, dags: Path, extra: Mapping[str, str]) -> Dict[str, str]:
    """Every process's environment: Airflow's settings on free ports, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    port = free_port()
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            # a task's calls to the execution API (the api-server) wait 5 s by default, 5
            # tries: on a loaded 2-core machine a new deployment's first task timed out all
            # five (`task_instances.start`, httpx ReadTimeout) and its try failed unstarted
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        }
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def airflow_deployment(
    directory: Path, dags: Path, extra_env: Mapping[str, str], cwd: Optional[Path] = None
) -> Iterator[AirflowDeployment]:
    """Copy a migrated sqlite db under ``directory``, start the four processes, yield the
    deployment once it is healthy; stop every process group at the end."""
    home = directory / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    env = deployment_env(home, dags, extra_env)
    copy_migrated_db(home / "airflow.db")
    af = AirflowDeployment(home, env, cwd or directory)
    try:
        for name in PROCESSES:
            af.start(name)
        deadline = time.monotonic() + START_TIMEOUT
        while not af.healthy():
            dead = [n for n, p in af.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"airflow {dead} exited; see {home}/<name>.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"airflow not healthy within {START_TIMEOUT:.0f} s; see {home}")
            time.sleep(0.5)
        yield af
    finally:
        af.stop_all()


def ancestors(pid: int) -> List[int]:
    """``pid``'s parents, nearest first."""
    import psutil

    found = []
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(pid).parents():
            found.append(p.pid)
    return found
