"""A failed ``local_cwd`` app says which exception, raised by which rank, ended it, though
torchelastic wrote no reply file (no ``@record``); a cancelled one's replicas say CANCELLED.
Real processes: torchrun with gloo, ``utils.python``, ``sh``."""

from __future__ import annotations

import json
import os
import random
import textwrap
from pathlib import Path

import pytest

from tests.polling import poll_until
from tests.schedulers.test_local_support import home, torchx
from torchx import specs
from torchx.runner import Runner, get_runner
from torchx.schedulers.local import failures

__all__ = ["home"]  # the fixture

pytestmark = pytest.mark.usefixtures("home")

RANK1_RAISES = """
import os
import torch.distributed as dist

dist.init_process_group("gloo")
print("rank", os.environ["RANK"], "up", flush=True)
if os.environ["RANK"] == "1":
    raise ValueError("boom-{n}")
dist.barrier()  # rank 0 fails too, later, when rank 1 is gone
"""

# its last stderr line is not the exception: what was shown before was that line
RAISES_THEN_LOGS = """
import atexit, sys
atexit.register(lambda: print("cleaning up", file=sys.stderr, flush=True))
raise ValueError("boom-{n}")
"""


def _ended(runner: Runner, handle: str, timeout: float) -> specs.AppStatus:
    """The app's terminal status; cancels it and fails the test past ``timeout`` s."""
    status = poll_until(
        lambda: runner.status(handle), lambda s: s is None or s.is_terminal(), timeout
    )
    if status is None or not status.is_terminal():
        runner.cancel(handle)
        pytest.fail(f"{handle} did not end within {timeout:.0f} s: {status}")
    return status


def test_a_rank_that_raises_without_record_is_named_with_its_exception(tmp_path: Path) -> None:
    n = random.randrange(10**6)
    script = tmp_path / "train.py"
    script.write_text(RANK1_RAISES.format(n=n))
    with get_runner() as runner:
        h = runner.run_component("dist.ddp", ["-j", "1x2", "--script", str(script)], "local_cwd")
        status = _ended(runner, h, timeout=240)
        assert status.state == specs.AppState.FAILED
        assert f"rank 1: ValueError: boom-{n}" in status.msg, status.msg
        assert status.structured_error_msg == specs.NONE  # no reply file was written
        cli = torchx("status", h)
    assert f"Msg: replica train/0 failed: rank 1: ValueError: boom-{n}" in cli.stdout, cli


def test_a_single_process_shows_its_exception_not_its_last_line(tmp_path: Path) -> None:
    n = random.randrange(10**6)
    (tmp_path / "job.py").write_text(RAISES_THEN_LOGS.format(n=n))
    with get_runner() as runner:
        h = runner.run_component("utils.python", ["--script", "job.py"], "local_cwd")
        status = _ended(runner, h, timeout=120)
    assert status.state == specs.AppState.FAILED
    assert status.msg == f"replica python/0 failed: ValueError: boom-{n}", status.msg


def test_a_cancelled_apps_replicas_are_cancelled() -> None:
    with get_runner() as runner:
        h = runner.run_component("utils.sh", ["sleep", "600"], "local_cwd")
        runner.cancel(h)
        status = runner.status(h)
    assert status is not None and status.state == specs.AppState.CANCELLED
    assert [r.state for role in status.roles for r in role.replicas] == [specs.AppState.CANCELLED]
    cli = torchx("status", h)
    assert " *sh[0]:CANCELLED\n" in cli.stdout and "reply file" not in cli.stdout, cli.stdout


# how torchrun's output reads, parsed without running it


def test_torchruns_default_prefix_and_root_cause_name_the_rank() -> None:
    text = textwrap.dedent(
        """\
        [default1]:Traceback (most recent call last):
        [default0]:Traceback (most recent call last):
        [default1]:  File "t.py", line 3, in <module>
        [default0]:  File "t.py", line 9, in <module>
        [default1]:KeyError: 'lr'
        [default0]:RuntimeError: peer closed
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        Root Cause (first observed failure):
        [0]:
          rank      : 3 (local_rank: 1)
          error_file: <N/A>
        ============================================================
        """
    )
    assert failures.last_traceback(text, failures.root_cause(text)) == failures.Failure(
        "KeyError: 'lr'", 3
    )


def test_the_failed_workers_reply_file_is_read_when_the_agent_wrote_none(tmp_path: Path) -> None:
    child = tmp_path / "attempt_0" / "1" / "error.json"
    child.parent.mkdir(parents=True)
    message = {"message": "OSError: disk full", "extraInfo": {"py_callstack": "Traceback ..."}}
    child.write_text(json.dumps({"message": message}))
    stderr = tmp_path / "stderr.log"
    stderr.write_text(
        f"Root Cause (first observed failure):\n  rank : 1 (local_rank: 1)\n  error_file: {child}\n"
    )
    found = failures.find(str(stderr), os.path.join(tmp_path, "missing.json"))
    assert str(found) == "rank 1: OSError: disk full"
