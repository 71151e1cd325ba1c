"""``report_progress`` never loses the last report: a rank that reports faster than the
file's throttle and then crashes (or returns) leaves its last step in the progress file, and
``torchx status`` shows it. Real processes, the installed console script."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import env
from tests.cli.test_cli import tx

__all__ = ["env"]  # the fixture

DEADLINE = 120  # generous: the machine is shared; nothing here asserts a time

# five reports within microseconds (well inside the 50 ms throttle), then a crash
CRASHING = (
    "from torchx.trackers import report_progress\n"
    "for i in range(1, 6):\n"
    "    report_progress(i, total=20, loss=1.0 / i)\n"
    "raise RuntimeError('rank broke after step 5')\n"
)


def test_status_shows_the_last_step_a_crashed_rank_reported(env: dict, tmp_path: Path) -> None:
    p = tx(["run", "-s", "local_cwd", "utils.python", "--c", CRASHING], env, tmp_path, DEADLINE)
    assert p.returncode != 0, p.stdout + p.stderr
    handle = p.stdout.splitlines()[0]
    assert handle.startswith("local_cwd://torchx/"), p.stdout

    status = tx(["status", handle], env, tmp_path)
    assert "FAILED" in status.stdout, status.stdout
    assert "progress: step 5/20" in status.stdout, status.stdout
    doc = json.loads(tx(["status", "--json", handle], env, tmp_path).stdout)
    assert doc["progress"]["step"] == 5 and doc["progress"]["metrics"] == {"loss": 0.2}, doc


def test_the_last_report_reaches_the_file_when_a_process_returns(tmp_path: Path) -> None:
    """Outside any launcher: a plain process that reports 1..1000 in a tight loop and
    returns; its file holds 1000 (with no total, so none is the final step), and no temp
    file is left beside it."""
    path = tmp_path / "progress.json"
    env = dict(os.environ, TORCHX_PROGRESS_FILE=str(path), RANK="0")
    env.pop("TORCHX_TRACKERS", None)
    code = (
        "from torchx.trackers import report_progress\n"
        "for i in range(1, 1001):\n"
        "    report_progress(i)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=DEADLINE)
    assert json.loads(path.read_text())["step"] == 1000
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
