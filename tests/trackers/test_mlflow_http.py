"""MLflow's client settings on torchx's REST path: MLflow's own defaults, its retries of
transient statuses, its credentials headers, one line for a bad value; and which store a URI
gets. A small local http server records what arrives (it plays a proxy in front of MLflow:
the real servers, with logins and TLS, are in test_mlflow_auth.py and test_mlflow_tls.py)."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from typing import Dict, Iterator, List, Tuple

import pytest

from torchx.trackers.api import TrackerConfigError
from torchx.trackers.mlflow_http import HttpSettings, client_env, redact
from torchx.trackers.mlflow_rest import MlflowRest, MlflowRestError
from torchx.trackers.mlflow_store import ClientStore, open_store

Seen = List[Tuple[str, Dict[str, str]]]  # (path, headers) of each request


@pytest.fixture()
def proxy() -> Iterator[Tuple[str, Seen, List[int]]]:
    """A server answering the statuses in its list (then 200 ``{}``), recording requests."""
    seen: Seen = []
    statuses: List[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, dict(self.headers)))
            status = statuses.pop(0) if statuses else 200
            body = b"{}" if status == 200 else json.dumps({"error_code": "X"}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen, statuses
    finally:
        server.shutdown()
        server.server_close()


FAST = {"MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0"}


def test_the_defaults_are_mlflows_own() -> None:
    from mlflow import environment_variables as mlflow_env

    ours = HttpSettings.from_env({})
    assert ours.max_retries == mlflow_env.MLFLOW_HTTP_REQUEST_MAX_RETRIES.default
    assert ours.backoff_factor == mlflow_env.MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.default
    assert ours.backoff_jitter == mlflow_env.MLFLOW_HTTP_REQUEST_BACKOFF_JITTER.default
    assert ours.timeout == mlflow_env.MLFLOW_HTTP_REQUEST_TIMEOUT.default
    assert ours.verify is True and ours.headers() == {}


def test_transient_statuses_are_retried_as_mlflows_client_does(
    proxy: Tuple[str, Seen, List[int]],
) -> None:
    url, seen, statuses = proxy
    statuses += [503, 429]
    MlflowRest(url, HttpSettings.from_env(FAST)).tag_run("r", "k", "v")  # a POST, retried
    assert [path for path, _ in seen] == ["/api/2.0/mlflow/runs/set-tag"] * 3
    statuses += [503, 503]
    one_retry = HttpSettings.from_env({**FAST, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"})
    with pytest.raises(MlflowRestError, match=r"\(503 ") as e:
        MlflowRest(url, one_retry).tag_run("r", "k", "v")
    assert e.value.status == 503 and len(seen) == 5
    statuses += [404]
    with pytest.raises(MlflowRestError, match=r"\(404 "):  # not transient: once
        MlflowRest(url, HttpSettings.from_env(FAST)).tag_run("r", "k", "v")
    assert len(seen) == 6


def test_credentials_are_sent_as_mlflows_client_sends_them(
    proxy: Tuple[str, Seen, List[int]],
) -> None:
    url, seen, _ = proxy
    basic = base64.b64encode(b"ann:pw").decode()
    login = {"MLFLOW_TRACKING_USERNAME": "ann", "MLFLOW_TRACKING_PASSWORD": "pw"}
    cases = [
        (url, {"MLFLOW_TRACKING_TOKEN": "tok"}, "Bearer tok"),
        (url, {**login, "MLFLOW_TRACKING_TOKEN": "tok"}, f"Basic {basic}"),  # the login wins
        (url.replace("://", "://ann:pw@"), {}, f"Basic {basic}"),  # in the URI
    ]
    for uri, env, header in cases:
        MlflowRest(uri, HttpSettings.from_env(env)).tag_run("r", "k", "v")
        assert seen[-1][1]["Authorization"] == header
    assert client_env({**login, "HOME": "/h"}) == login  # what a job's env gets


def test_a_refused_login_says_which_settings_to_set(proxy: Tuple[str, Seen, List[int]]) -> None:
    url, _, statuses = proxy
    statuses += [401]
    rest = MlflowRest(url.replace("://", "://ann:secret@"), HttpSettings.from_env(FAST))
    with pytest.raises(TrackerConfigError) as e:
        rest.health()
    message = str(e.value)
    assert message.startswith(f"MLflow tracking server {url}: refused ") and "(401 " in message
    assert "MLFLOW_TRACKING_USERNAME" in message and "secret" not in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "env, named",
    [
        ({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "many"}, "MLFLOW_HTTP_REQUEST_MAX_RETRIES"),
        ({"MLFLOW_TRACKING_INSECURE_TLS": "yes please"}, "MLFLOW_TRACKING_INSECURE_TLS"),
        (
            {"MLFLOW_TRACKING_INSECURE_TLS": "true", "MLFLOW_TRACKING_SERVER_CERT_PATH": "ca"},
            "MLFLOW_TRACKING_SERVER_CERT_PATH",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(env: Dict[str, str], named: str) -> None:
    with pytest.raises(TrackerConfigError, match=named) as e:
        HttpSettings.from_env(env)
    assert "\n" not in str(e.value)


def test_redact_keeps_the_server_and_drops_the_login() -> None:
    assert redact("https://ann:p%40ss@mlflow.example:8443/p") == "https://mlflow.example:8443/p"
    assert redact("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


@pytest.mark.parametrize("uri", ["databricks", "databricks://profile", "myplugin://store/x"])
def test_other_schemes_go_through_mlflows_own_client(uri: str) -> None:
    """Nothing is contacted to choose: the client is only made at the first call."""
    assert isinstance(open_store(uri, lambda: None), ClientStore)
    assert isinstance(open_store("https://h", lambda: None), MlflowRest)
