"""A real ``mlflow server`` on a free loopback port, for tests that need http links.

    with mlflow_server(tmp_path) as url:   # "http://127.0.0.1:<port>"
        ...

The server keeps its runs in ``<dir>/mlflow.db`` (sqlite) and artifacts in
``<dir>/artifacts``; it is stopped (its whole process group) when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Union

START_TIMEOUT = 240.0  # a cold start on a loaded 2-core machine takes 15-60 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers_health(url: str) -> bool:
    """Whether ``url/health`` answers 200 (an MLflow or Prefect server is up)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def mlflow_server(directory: Union[str, Path], timeout: float = START_TIMEOUT) -> Iterator[str]:
    """Start ``mlflow server`` storing under ``directory``; yield its http URL once it answers."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    with open(directory / "server.log", "ab") as log:
        server = subprocess.Popen(
            [
                mlflow,
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--backend-store-uri",
                f"sqlite:///{directory / 'mlflow.db'}",
                "--default-artifact-root",
                str(directory / "artifacts"),
                "--workers",
                "1",
            ],
            env=env,
            start_new_session=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not answers_health(url):
            if server.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {server.returncode}; see {directory}/server.log"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlflow server on {url} did not answer within {timeout:.0f} s")
            time.sleep(0.25)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
