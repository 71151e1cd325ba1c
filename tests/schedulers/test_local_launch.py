"""How local_cwd starts a supervisor: a fork of a single-threaded launcher, a new
interpreter otherwise; either way it outlives its launcher in a session of its own and
holds none of the launcher's files (a caller reading the launcher's output to its end
is not kept waiting by the app)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.schedulers.test_local_support import alive, app_dir, home
from torchx import specs
from torchx.runner import get_runner

__all__ = ["home"]

pytestmark = pytest.mark.usefixtures("home")

LAUNCH = """
import sys, threading, time
from torchx import specs
from torchx.runner import get_runner
if sys.argv[1] == "thread":  # a second thread: the launcher must not fork
    threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
role = specs.Role("w", ".", entrypoint="sh", args=["-c", "echo started; sleep 300"])
print(get_runner().run(specs.AppDef("t", [role]), "local_cwd"), flush=True)
"""


@pytest.mark.parametrize("mode, forked", [("plain", True), ("thread", False)])
def test_the_supervisor_outlives_its_launcher_and_holds_none_of_its_files(
    mode: str, forked: bool, tmp_path: Path
) -> None:
    # returns only once no process holds the launcher's stdout/stderr pipes
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCH, mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert launcher.returncode == 0, launcher.stderr
    handle = launcher.stdout.split()[-1]
    d = app_dir(handle)
    sup = int((d / "supervisor.pid").read_text().split()[0])
    with get_runner() as runner:
        try:
            assert alive([sup]) == [sup]
            cmd = Path(f"/proc/{sup}/cmdline").read_bytes()
            assert (b"torchx.schedulers.local.supervisor" not in cmd) == forked, cmd
            assert os.getsid(sup) == sup
            fds = {os.readlink(f"/proc/{sup}/fd/{fd}") for fd in os.listdir(f"/proc/{sup}/fd")}
            assert str(d / "supervisor.log") in fds and "/dev/null" in fds
            status = runner.status(handle)
            assert status is not None and status.state == specs.AppState.RUNNING, status
            lines = runner.log_lines(handle, "w", should_tail=True)
            assert next(iter(lines)) == "started\n"
        finally:
            runner.cancel(handle)
        status = runner.status(handle)
        assert status is not None and status.state == specs.AppState.CANCELLED, status
    assert (d / "supervisor.log").read_text() == ""
