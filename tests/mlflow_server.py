"""A real ``mlflow server`` on a free loopback port, for tests that need http links.

    with mlflow_server(tmp_path) as url:   # "http://127.0.0.1:<port>"
        ...

The server keeps its runs in ``<dir>/mlflow.db`` (sqlite) and artifacts in
``<dir>/artifacts``; it is stopped (its whole process group) when the block ends.
``admin=(user, password)``: MLflow's ``basic-auth`` app, every call needs credentials.
``tls=True``: https with a self-signed certificate for 127.0.0.1, ``<dir>/cert.pem``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

START_TIMEOUT = 240.0  # a cold start on a loaded 2-core machine takes 15-60 s


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range and above Ray's
    worker ports (10002-19999): a port from the ephemeral range can be taken by any outgoing
    connection between this check and the server's bind (a Ray head binds nine, one by one)."""
    top = max(_ephemeral_floor(), 20001)
    while True:
        port = random.randrange(20000, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def answers_health(url: str, ca: Optional[Path] = None) -> bool:
    """Whether ``url/health`` answers 200 (an MLflow or Prefect server is up); ``ca``: the
    certificate an https server is trusted by."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(url + "/health", timeout=2, context=context) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def self_signed_cert(directory: Path) -> Tuple[Path, Path]:
    """A certificate (and its key) for 127.0.0.1 and localhost, made by ``openssl``."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def _auth_env(directory: Path, admin: Tuple[str, str]) -> Dict[str, str]:
    """MLflow's basic-auth app: its ini file (users in ``<dir>/auth.db``), a secret key."""
    ini = directory / "auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{directory / 'auth.db'}\n"
        f"admin_username = {admin[0]}\nadmin_password = {admin[1]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex(),
    }


@contextlib.contextmanager
def mlflow_server(
    directory: Union[str, Path],
    timeout: float = START_TIMEOUT,
    admin: Optional[Tuple[str, str]] = None,
    tls: bool = False,
) -> Iterator[str]:
    """Start ``mlflow server`` storing under ``directory``; yield its URL once it answers."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    for var in [v for v in env if v.startswith("MLFLOW_TRACKING_")]:
        del env[var]  # the server's own calls are not a client's
    extra, ca = [], None
    if admin is not None:
        env.update(_auth_env(directory, admin))
        extra += ["--app-name", "basic-auth"]
    if tls:
        ca, key = self_signed_cert(directory)
        extra += [
            "--uvicorn-opts",
            f"--ssl-certfile {ca} --ssl-keyfile {key} --timeout-graceful-shutdown 2",
        ]
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
                *extra,
            ],
            env=env,
            start_new_session=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not answers_health(url, ca):
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


@contextlib.contextmanager
def counting_proxy(url: str) -> Iterator[Tuple[str, List[str]]]:
    """A plain http proxy in front of the server at ``url`` that records each request's
    ``METHOD path`` (whoever sends it: torchx's REST calls or MLflow's own client)."""
    import http.client
    import http.server
    import threading
    import urllib.parse

    target = urllib.parse.urlsplit(url)
    seen: List[str] = []

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(f"{self.command} {self.path.split('?')[0]}")
            conn = http.client.HTTPConnection(str(target.hostname), target.port, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body or None, headers)
                answer = conn.getresponse()
                data = answer.read()
            finally:
                conn.close()
            self.send_response(answer.status, answer.reason)
            for k, v in answer.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
