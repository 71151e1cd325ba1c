"""A real Prefect 3 deployment for tests: ``prefect server``, a ``process`` work pool, a
worker, and deployments made with ``flow.from_source(<dir>, "file.py:fn").deploy()``.

    with prefect_deployment(tmp, {"stages": (flows_dir, "deployed_flows.py:stages")}) as d:
        flow_run_id = d.run("stages", {"run": "a", "seconds": [1]})
        d.wait_for_state(flow_run_id, {"COMPLETED"})

Everything binds 127.0.0.1 on free ports and keeps its state under ``tmp``; the worker and
its flow runs use the test process's ``TORCHX_HOME`` (so the test sees their apps) and
import torchx from this checkout. The test process talks to the server through an explicit
client (its own Prefect settings are left alone). On exit the worker is stopped before the
server, each by its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple
from uuid import UUID

import psutil

from tests.mlflow_server import answers_health, free_port

REPO = Path(__file__).resolve().parents[2]
POOL = "torchx-test-pool"
START_TIMEOUT = 240.0  # a cold server on a loaded 2-core machine
STOP_TIMEOUT = 30.0

_DEPLOY = """
import json, sys
from prefect import flow
out = {}
for name, (source, entrypoint) in json.loads(sys.argv[1]).items():
    out[name] = str(flow.from_source(source, entrypoint).deploy(
        name, work_pool_name=sys.argv[2], print_next_steps=False))
print(json.dumps(out))
"""


@dataclass
class PrefectDeployment:
    """A running server + worker, and the ids of the deployments made on it."""

    api_url: str
    env: Dict[str, str]
    worker: subprocess.Popen  # type: ignore[type-arg]
    deployments: Dict[str, str] = field(default_factory=dict)

    def client(self) -> Any:
        from prefect.client.orchestration import SyncPrefectClient

        return SyncPrefectClient(self.api_url)

    def run(
        self,
        deployment: str,
        parameters: Mapping[str, Any],
        job_variables: Optional[Mapping[str, Any]] = None,
    ) -> str:
        """Create a flow run of ``deployment`` (as ``run_deployment`` does); its id."""
        with self.client() as c:
            fr = c.create_flow_run_from_deployment(
                UUID(self.deployments[deployment]),
                parameters=dict(parameters),
                job_variables=dict(job_variables or {}),
            )
        return str(fr.id)

    def state(self, flow_run_id: str) -> str:
        with self.client() as c:
            fr = c.read_flow_run(UUID(flow_run_id))
        return fr.state.type.value if fr.state else "NONE"

    def wait_for_state(self, flow_run_id: str, states: Set[str], timeout: float = 180) -> str:
        """Poll until the flow run is in one of ``states``; fails with the last one seen."""
        deadline = time.monotonic() + timeout
        seen = self.state(flow_run_id)
        while seen not in states and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = self.state(flow_run_id)
        assert seen in states, f"flow run {flow_run_id} is {seen}, not {states}, after {timeout}s"
        return seen

    def cancel(self, flow_run_id: str) -> None:
        """Cancel as the UI does: set the flow run Cancelling; the worker does the rest."""
        from prefect.client.schemas.objects import State, StateType

        with self.client() as c:
            c.set_flow_run_state(UUID(flow_run_id), State(type=StateType.CANCELLING), force=True)

    def retry(self, flow_run_id: str) -> None:
        """Retry as the UI does: propose ``Scheduled`` named ``AwaitingRetry`` (not forced)."""
        from prefect.states import Scheduled

        with self.client() as c:
            result = c.set_flow_run_state(
                UUID(flow_run_id),
                Scheduled(name="AwaitingRetry", message="Retry from the UI"),
                force=False,
            )
        assert result.status.value == "ACCEPT", result

    def flow_run_process(self, flow_run_id: str) -> Optional[psutil.Process]:
        """The worker's child that runs the flow run (its apps carry the same variable,
        but they are not the worker's children)."""
        for p in psutil.Process(self.worker.pid).children(recursive=False):
            try:
                if p.environ().get("PREFECT__FLOW_RUN_ID") == flow_run_id:
                    return p
            except psutil.Error:
                pass
        return None

    def logs(self, flow_run_id: str) -> List[str]:
        """The flow run's log messages (its tasks' included), oldest first."""
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        with self.client() as c:
            logs = c.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)])), limit=200
            )
        return [log.message for log in logs]

    def artifact_keys(self, flow_run_id: str) -> Set[str]:
        """Keys of the artifacts the flow run (and its tasks) created."""
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        with self.client() as c:
            found = c.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)])
                )
            )
        return {a.key for a in found if a.key}


def _start(args: List[str], env: Mapping[str, str], log: Path) -> subprocess.Popen:  # type: ignore[type-arg]
    with open(log, "ab") as out:
        return subprocess.Popen(
            args,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one
        )


def _stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM the process group, SIGKILL it after ``STOP_TIMEOUT``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_TIMEOUT)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@contextlib.contextmanager
def prefect_deployment(
    directory: Path, deployments: Mapping[str, Tuple[Path, str]]
) -> Iterator[PrefectDeployment]:
    """Start server, pool and worker; deploy ``{name: (source_dir, "file.py:fn")}``."""
    directory.mkdir(parents=True, exist_ok=True)
    sources = {name: [str(src), entry] for name, (src, entry) in deployments.items()}
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "PREFECT_HOME": str(directory / "prefect"),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_MEMO_STORE_PATH": str(directory / "memo_store.toml"),
        "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.3",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "1",
        "PREFECT_LOCAL_STORAGE_PATH": str(directory / "results"),
    }
    prefect = os.path.join(bin_dir, "prefect")
    server_log, worker_log = directory / "server.log", directory / "worker.log"
    server = _start(
        [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env, server_log
    )
    worker = None
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not answers_health(api_url):
            assert server.poll() is None, f"prefect server exited: {_tail(server_log)}"
            assert time.monotonic() < deadline, f"server not up: {_tail(server_log)}"
            time.sleep(0.5)
        subprocess.run(
            [prefect, "work-pool", "create", "--type", "process", POOL],
            env=env,
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT,
        )
        worker = _start([prefect, "worker", "start", "--pool", POOL], env, worker_log)
        made = subprocess.run(
            [sys.executable, "-c", _DEPLOY, json.dumps(sources), POOL],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        assert made.returncode == 0, made.stderr[-3000:]
        ids = json.loads(made.stdout.strip().splitlines()[-1])
        yield PrefectDeployment(api_url, env, worker, ids)
    finally:
        if worker is not None:
            _stop(worker)  # the worker first: it would mark its flow runs crashed otherwise
        _stop(server)


@contextlib.contextmanager
def _torchx_home(home: Optional[str]) -> Iterator[None]:
    """This test process's ``TORCHX_HOME`` set to ``home`` for the block (None: unchanged)."""
    if home is None:
        yield
        return
    before = os.environ.get("TORCHX_HOME")
    os.environ["TORCHX_HOME"] = home
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHX_HOME", None)
        else:
            os.environ["TORCHX_HOME"] = before


def stage_apps(key: str, home: Optional[str] = None) -> List[Tuple[str, str]]:
    """``(handle, state)`` of every local_cwd app whose command names the stage ``key``
    (see ``deployed_flows.command``), under ``home`` (default: this process's), oldest first."""
    from torchx.runner import get_runner

    marker = f"echo {key} done"
    found = []
    with _torchx_home(home), get_runner() as runner:
        for app in reversed(runner.list("local_cwd")):
            appdef = runner.describe(app.app_handle)
            if appdef and any(marker in " ".join(r.args) for r in appdef.roles):
                found.append((app.app_handle, app.state.name))
    return found


def cancel_live_apps(home: Optional[str] = None) -> List[str]:
    """Cancel every local_cwd app still running under ``home`` (a failed test leaves no
    600-second app behind); the handles cancelled."""
    from torchx.runner import get_runner
    from torchx.specs.api import is_terminal

    cancelled = []
    with _torchx_home(home), get_runner(trackers={}) as runner:
        for app in runner.list("local_cwd"):
            if not is_terminal(app.state):
                runner.cancel(app.app_handle)
                cancelled.append(app.app_handle)
    return cancelled
