"""``torchx reap`` with KFP owners: real local_cwd jobs, the real CLI, and KFP's REST API
``GET /apis/v2beta1/runs/{run_id}`` served by a local HTTP server on a free loopback port.

Why a served answer: a KFP API server needs Kubernetes (its backend drives Argo
workflows), and none can run on this machine. The answers are the documented shape of
KFP 2's ``V2beta1Run`` (``run_id``, ``display_name``, ``state`` among ``PENDING``,
``RUNNING``, ``SUCCEEDED``, ``SKIPPED``, ``FAILED``, ``CANCELING``, ``CANCELED``,
``PAUSED``, as ``kfp_server_api.models.V2beta1RuntimeState`` lists them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.polling import poll_until
from torchx import specs
from torchx.pipelines.owner import Owner
from torchx.runner import get_runner

RUNS = {"run-failed": "FAILED", "run-canceled": "CANCELED", "run-running": "RUNNING"}
RUNS["run-succeeded"] = "SUCCEEDED"  # kept: a stage may leave its job running on purpose


@pytest.fixture()
def kfp_api() -> Iterator[str]:
    seen: List[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.path)
            prefix = "/apis/v2beta1/runs/"
            run_id = self.path[len(prefix) :] if self.path.startswith(prefix) else ""
            if run_id not in RUNS:
                self.send_error(404, "run not found")
                return
            body = json.dumps({"run_id": run_id, "display_name": run_id, "state": RUNS[run_id]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        assert seen, "the KFP API was never asked"


def _reap(url: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "reap", "--kfp_url", url, *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def test_reap_cancels_jobs_of_failed_or_canceled_kfp_runs_only(
    kfp_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KF_PIPELINES_ENDPOINT", raising=False)
    monkeypatch.chdir(tmp_path)
    with get_runner(trackers={}) as runner:
        handles: Dict[str, str] = {
            run: runner.run_component(
                "utils.sh",
                ["sleep", "600"],
                "local_cwd",
                owner=Owner("kfp", {"run": run, "task": "train"}).to_metadata(),
            )
            for run in [*RUNS, "run-unknown"]
        }
        try:
            dry = _reap(kfp_api, "--dryrun")
            assert dry.returncode == 0, dry.stderr
            for run, handle in handles.items():
                verdict = "ORPHAN" if run in ("run-failed", "run-canceled") else "kept"
                assert f"{verdict} {handle} owner: kfp run={run}" in dry.stdout, dry.stdout
            assert "2 orphan(s) of 5 owned live app(s); dry run" in dry.stdout
            assert all(runner.status(h).state == specs.AppState.RUNNING for h in handles.values())

            done = _reap(kfp_api)
            assert done.returncode == 0, done.stderr
            for run in ("run-failed", "run-canceled"):
                assert f"cancelled {handles[run]}" in done.stdout
                status = poll_until(
                    lambda h=handles[run]: runner.status(h), lambda s: s.is_terminal(), 60
                )
                assert status.state == specs.AppState.CANCELLED, status
            for run in ("run-running", "run-succeeded", "run-unknown"):
                assert runner.status(handles[run]).state == specs.AppState.RUNNING
        finally:
            for handle in handles.values():
                runner.cancel(handle)


def test_no_kfp_url_keeps_the_job_and_says_how_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KF_PIPELINES_ENDPOINT", raising=False)
    monkeypatch.chdir(tmp_path)
    with get_runner(trackers={}) as runner:
        owner = Owner("kfp", {"run": "run-failed", "task": "train"}).to_metadata()
        handle = runner.run_component("utils.sh", ["sleep", "600"], "local_cwd", owner=owner)
        try:
            out = subprocess.run(
                [sys.executable, "-m", "torchx.cli.main", "reap"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode != 0 and "Traceback" not in out.stderr
            assert "--kfp_url or set KF_PIPELINES_ENDPOINT" in out.stderr, out.stderr
            assert runner.status(handle).state == specs.AppState.RUNNING
        finally:
            runner.cancel(handle)
