"""``torchx status`` shows a running job's progress; ``torchx run --stall_timeout`` ends a
stalled job FAILED with one line saying so, and no process of it is left. Real processes,
the installed console script."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import TORCHX, tx
from tests.polling import poll_until
from tests.processes import job_processes

DEADLINE = 90  # generous: the machine is shared; nothing here asserts a time

REPORTING = (
    "from torchx.trackers import report_progress; import time\n"
    "for i in range(1, 101):\n"
    "    report_progress(i, total=100, loss=1.0 / i); time.sleep(0.5)"
)
STEP = re.compile(r"progress: step (\d+)/100, [0-9.e+]+ steps/s, ETA \S+, last report \S+ ago")


def test_status_shows_the_step_rate_and_eta_while_it_runs(env: dict, tmp_path: Path) -> None:
    run = subprocess.Popen(
        [TORCHX, "run", "-s", "local_cwd", "utils.python", "--c", REPORTING],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None
        handle = run.stdout.readline().strip()
        assert handle.startswith("local_cwd://torchx/"), handle

        def status() -> str:
            return tx(["status", handle], env, tmp_path).stdout

        def step(out: str) -> int:
            m = STEP.search(out)
            return int(m.group(1)) if m else 0

        first = poll_until(status, lambda out: step(out) >= 2, timeout=DEADLINE)
        assert "State: RUNNING" in first and step(first) >= 2, first
        later = poll_until(status, lambda out: step(out) > step(first), timeout=DEADLINE)
        assert step(later) > step(first), later  # it moves while the job runs
        p = tx(["status", "--json", handle], env, tmp_path)
        assert '"total": 100' in p.stdout, p.stdout
    finally:
        if run.poll() is None:
            tx(["cancel", handle], env, tmp_path)
        run.communicate(timeout=DEADLINE)


def test_a_stalled_run_ends_failed_with_one_line_and_no_process(env: dict, tmp_path: Path) -> None:
    code = (
        "from torchx.trackers import report_progress; import time;"
        " report_progress(1, total=10); time.sleep(300)"
    )
    p = tx(
        ["run", "-s", "local_cwd", "--stall_timeout", "10", "utils.python", "--c", code],
        env,
        tmp_path,
        timeout=DEADLINE,
    )
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1, p.stderr
    assert "FAILED" in err[0]
    assert "stalled: no progress or output for 10 s (last step 1)" in err[0]
    handle = p.stdout.splitlines()[0]
    assert job_processes(handle) == []
    status = tx(["status", handle], env, tmp_path).stdout
    assert "State: FAILED" in status and "stalled" in status, status
    assert "progress: step 1/10" in status, status


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_bad_stall_timeout_is_one_usage_line(env: dict, tmp_path: Path, value: str) -> None:
    p = tx(["run", "--stall_timeout", value, "utils.echo"], env, tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"torchx: error: --stall_timeout {float(value):g}: give a number of seconds > 0"
    ]


def test_the_dryrun_shows_the_stall_timeout(env: dict, tmp_path: Path) -> None:
    p = tx(["run", "--dryrun", "--stall_timeout", "7.5", "utils.echo"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "stall_timeout: 7.5 s" in p.stdout
    assert "'torchx.stall_timeout': '7.5'" in p.stdout
