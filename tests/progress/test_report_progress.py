"""``report_progress`` in a real process: where it writes, who counts, what a reader sees,
and that a broken destination never breaks the caller."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

from torchx.runtime.progress import ENV_PROGRESS_FILE, Progress, read_progress

REPORT = """
import time
from torchx.trackers import report_progress
for i in range(1, 6):
    report_progress(i, total=5, loss=1.0 / i, note="not a number")
    time.sleep(0.06)
print("done")
"""


def run(code: str, env: Dict[str, Optional[str]]) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in (ENV_PROGRESS_FILE, "RANK")}
    e.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60
    )


def test_rank0_writes_its_last_step_total_rate_and_numeric_metrics(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    p = run(REPORT, {ENV_PROGRESS_FILE: str(path), "RANK": "0"})
    assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr
    got = read_progress(str(path))
    assert got is not None
    assert (got.step, got.total) == (5, 5)
    assert got.metrics == {"loss": 0.2}
    assert got.rate is not None and got.rate > 0
    assert [f.name for f in tmp_path.iterdir()] == ["progress.json"]  # no temp file left


def test_other_ranks_and_jobs_without_a_destination_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    p = run(REPORT, {ENV_PROGRESS_FILE: str(path), "RANK": "1"})
    assert p.returncode == 0 and not path.exists(), p.stderr
    p = run(REPORT, {})
    assert p.returncode == 0 and p.stdout.strip() == "done" and not p.stderr, p.stderr


def test_an_unwritable_destination_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    p = run(REPORT, {ENV_PROGRESS_FILE: str(tmp_path / "missing" / "progress.json")})
    assert p.returncode == 0 and p.stdout.strip() == "done"
    warnings = [line for line in p.stderr.splitlines() if "report_progress" in line]
    assert len(warnings) == 1, p.stderr


def test_readers_see_nothing_for_a_missing_or_bad_file(tmp_path: Path) -> None:
    assert read_progress(None) is None
    assert read_progress(str(tmp_path / "none.json")) is None
    bad = tmp_path / "bad.json"
    for text in ("", "{", json.dumps({"step": "x"}), json.dumps([1])):
        bad.write_text(text)
        assert read_progress(str(bad)) is None, text


def test_the_status_line_shows_step_rate_eta_and_age() -> None:
    p = Progress(step=40, total=100, time=1000.0, rate=2.0)
    assert p.format(now=1003.0) == "step 40/100, 2 steps/s, ETA 30s, last report 3.0s ago"
    assert p.format(running=False, now=1003.0) == "step 40/100, 2 steps/s, last report 3.0s ago"
    assert Progress(step=7, time=1000.0).format(now=1000.5) == "step 7, last report 0.5s ago"


FINAL_THEN_WAIT = """
import sys
from torchx.trackers import report_progress
for i in range(1, 6):
    report_progress(i, total=5, loss=1.0 / i)
print("trained", flush=True)
sys.stdin.readline()  # the test says when the main thread may end
"""


def test_a_tracker_that_never_answers_holds_neither_training_nor_the_exit_for_long() -> None:
    """A tracked rank 0 whose MLflow server accepts connections and never answers: the final
    report returns while its send hangs, and the exit waits for that send at most
    ``FINAL_SEND_WAIT`` s (one request alone may take MLflow's 120 s timeout, times retries).
    """
    with socket.socket() as silent:  # listens, never accepts: a request hangs
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if k not in (ENV_PROGRESS_FILE, "RANK")}
        env.update(
            TORCHX_TRACKERS="mlflow",
            TORCHX_TRACKER_MLFLOW_CONFIG=url,
            TORCHX_JOB_ID="local_cwd://session/silent-app",
            MLFLOW_TRACKING_URI=url,
            MLFLOW_RUN_ID="0123456789abcdef0123456789abcdef",
        )
        child = subprocess.Popen(
            [sys.executable, "-c", FINAL_THEN_WAIT],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "trained"  # the final report returned
            silent.settimeout(120)
            conn, _ = silent.accept()  # its send is under way, and gets no answer
            with conn:
                child.stdin.close()  # the main thread ends: the exit waits, bounded
                code = child.wait(timeout=100)
            assert code == 0, child.stderr.read() if child.stderr else ""
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
