"""local_cwd output: every line exact (a million through ``torchx run``), lines over
1 MiB split with a visible marker, and the memory of the supervisor and of a log reader
bounded whatever the length of a line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from tests.polling import poll
from tests.schedulers.test_local_support import (
    app,
    app_dir,
    home,
    role,
    run_python,
    torchx,
)
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.api import Stream
from torchx.schedulers.local.logs import LINE_LIMIT, LINE_SPLIT_MARKER, LineBuffer

__all__ = ["home"]

pytestmark = pytest.mark.usefixtures("home")
MARKER = LINE_SPLIT_MARKER.decode()
PIECE = LINE_LIMIT - len(LINE_SPLIT_MARKER)


def test_a_million_lines_through_torchx_run_are_exact(tmp_path: Path) -> None:
    out = torchx("run", "-s", "local_cwd", "utils.sh", "seq", "1000000", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert lines[0].startswith("local_cwd://torchx/sh-") and lines[-1] == ""
    assert lines[1:-1] == [f"sh/0 {i}" for i in range(1, 1000001)]


def _unsplit(lines: List[str]) -> str:
    """The original text of lines that may hold split pieces."""
    return "".join(ln[: -len(MARKER) - 1] if ln.endswith(MARKER + "\n") else ln for ln in lines)


LONG = (
    "import sys; w = sys.stdout.write;"
    " w('a' * 3000000 + 'é' * 700000 + '\\n'); w('short\\n'); w('b' * 1048576 + '\\n');"
    " w('tail-without-newline')"
)


def test_lines_over_the_limit_are_split_with_a_marker_in_every_stream() -> None:
    expected = "a" * 3000000 + "é" * 700000 + "\nshort\n" + "b" * 1048576 + "\ntail-without-newline"
    with get_runner() as runner:
        h = runner.run(app(role(f'python3 -c "{LONG}"')), "local_cwd")
        assert runner.wait(h, wait_interval=0.1).state == specs.AppState.SUCCEEDED  # type: ignore[union-attr]
        for stream in (Stream.COMBINED, Stream.STDOUT):
            for tail in (False, True):
                lines = list(runner.log_lines(h, "w", streams=stream, should_tail=tail))
                assert _unsplit(lines) == expected
                assert all(len(ln.encode()) <= LINE_LIMIT + 1 for ln in lines)
                pieces = [ln for ln in lines if ln.endswith(MARKER + "\n")]
                assert len(pieces) == 4  # 4.4 MB of the first line: 4 pieces and the rest
                assert lines[5:] == ["short\n", "b" * 1048576 + "\n", "tail-without-newline"]
                assert all(len(p.encode()) == LINE_LIMIT + 1 or "é" in p for p in pieces)
                assert "\ufffd" not in "".join(lines)  # no character cut in two
    out = torchx("log", h)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.split("\n")
    assert sum(1 for ln in printed if ln.endswith(MARKER)) == 4
    assert all(ln.startswith("w/0 ") for ln in printed[:-1])


def test_line_buffer_splits_long_lines_and_keeps_short_ones_whole() -> None:
    buf = LineBuffer(limit=100)
    out = b""
    text = b"x" * 250 + b"\n" + b"y" * 100 + b"\n" + b"z" * 99 + b"\n" + b"w" * 30
    for i in range(0, len(text), 7):
        out += buf.feed(text[i : i + 7])
    out += buf.rest()
    lines = out.split(b"\n")
    piece = 100 - len(LINE_SPLIT_MARKER)
    assert lines[0] == b"x" * piece + LINE_SPLIT_MARKER
    assert lines[1] == b"x" * piece + LINE_SPLIT_MARKER
    assert out.replace(LINE_SPLIT_MARKER + b"\n", b"") == text
    assert b"y" * 100 in lines and b"z" * 99 in lines and lines[-1] == b"w" * 30


HUGE_LINE = (
    "import sys, time; sys.stdout.write('x' * (64 << 20)); sys.stdout.flush(); time.sleep(600)"
)

READ = """
import re, sys
from torchx.runner import get_runner
from torchx.schedulers.api import Stream
n = size = 0
for line in get_runner().log_lines(sys.argv[1], "w", streams=Stream.STDOUT):
    n, size = n + 1, size + len(line)
status = open("/proc/self/status").read()  # VmHWM: this process's peak (maxrss is not)
print(n, size, int(re.search(r"VmHWM:\\s+(\\d+) kB", status)[1]) // 1024)
"""


def _vm_hwm_mb(pid: int) -> int:
    """The peak resident memory of ``pid`` in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text)[1]) // 1024  # type: ignore[index]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_64_mb_line_costs_the_supervisor_and_a_reader_little_memory(tmp_path: Path) -> None:
    with get_runner() as runner:
        h = runner.run(app(role(f'python3 -c "{HUGE_LINE}"')), "local_cwd")
        try:
            logs = app_dir(h) / "w" / "0"

            def written() -> bool:
                sizes = [(logs / f).stat().st_size for f in ("stdout.log", "combined.log")]
                return sizes[0] == 64 << 20 and sizes[1] >= 64 << 20

            poll(written, what="the 64 MB line in stdout.log and combined.log")
            sup = int((app_dir(h) / "supervisor.pid").read_text().split()[0])
            assert _vm_hwm_mb(sup) < 60  # it held ~1 MiB of the line, never all 64
            n, size, peak_mb = map(int, run_python(READ, tmp_path, h).split())
            # 64 pieces with a marker each, and the rest of the line (no newline yet)
            assert n == 65 and size == (64 << 20) + 64 * (len(MARKER) + 1)
            assert peak_mb < 80  # the reader too: an interpreter plus a few MiB
        finally:
            runner.cancel(h)


def test_output_of_both_streams_is_whole_lines_in_combined() -> None:
    script = (
        'python3 -c "import sys\nfor i in range(3000):\n'
        " sys.stdout.write('out %d ' % i + 'o' * 300 + '\\n'); sys.stderr.write('err %d\\n' % i)\""
    )
    with get_runner() as runner:
        h = runner.run(app(role(script)), "local_cwd")
        runner.wait(h, wait_interval=0.1)
        lines = list(runner.log_lines(h, "w"))
    assert len(lines) == 6000
    assert sorted(ln for ln in lines if ln.startswith("err")) == sorted(
        f"err {i}\n" for i in range(3000)
    )
    assert all(re.fullmatch(r"(out \d+ o{300}|err \d+)\n", ln) for ln in lines)


def test_log_lines_split_only_at_newlines(tmp_path: Path) -> None:
    with get_runner() as runner:
        h = runner.run(app(role("printf 'a\\rb\\014c\\n\\377\\376 d\\n'")), "local_cwd")
        runner.wait(h, wait_interval=0.1)
        assert list(runner.log_lines(h, "w")) == ["a\rb\x0cc\n", "\ufffd\ufffd d\n"]
    out = subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "log", h],
        capture_output=True,
        env=dict(os.environ),
    )
    assert out.stdout.split(b"\n")[0] == b"w/0 a\rb\x0cc"
