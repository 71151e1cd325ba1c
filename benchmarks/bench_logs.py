"""Log throughput of ``local_cwd``: this torchx vs upstream torchx 0.7.0, side by side.

Run: ``bash benchmarks/run.sh`` (bench_cli.py calls this at its end), or alone:
``.venv/bin/python benchmarks/bench_logs.py`` once ``benchmarks/setup_upstream.sh`` ran.

- ``torchx run -s local_cwd utils.sh seq 1000000``: wall time, and every line checked
  (upstream prints the lines on stderr, we on stdout; both are read).
- ``torchx log`` of that app from another process, after it ended (ours only: upstream's
  ``torchx log`` of an app launched elsewhere waits forever).
- One 200 MB line: wall time and peak memory of the ``torchx run`` client and of the
  process copying the output (our supervisor; upstream does it in the client).

Results replace the "Logs" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cli import OURS_BIN, ROOT, UPSTREAM_BIN, Impl, replace_section  # noqa: E402

SEQ_N = 1_000_000
BIG_LINE = 200_000_000
BIG = f"import sys; sys.stdout.write('x' * {BIG_LINE} + chr(10))"
MARKER = b"[torchx: line longer than 1 MiB"


class Output:
    """What a process printed: kept whole, or only counted (for a 200 MB line)."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.chunks: List[bytes] = []
        self.counts = {b"x": 0, MARKER: 0, b"torchx": 0, b"next": 0}
        self.tail = b""

    def add(self, chunk: bytes) -> None:
        if self.keep:
            self.chunks.append(chunk)
            return
        data = self.tail + chunk  # a word may straddle two chunks
        self.counts[b"x"] += chunk.count(b"x")
        for word in (MARKER, b"torchx", b"next"):
            self.counts[word] += data.count(word) - self.tail.count(word)
        self.tail = data[-len(MARKER) :]

    def data(self) -> bytes:
        return b"".join(self.chunks)


def _read_all(stream, sink: Output) -> None:  # type: ignore[no-untyped-def]
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        sink.add(chunk)


def run_checked(
    cmd: List[str], env: Dict[str, str], cwd: str, keep: bool = True, timeout: float = 900
) -> Tuple[float, Output, Output, int]:
    """(wall seconds, stdout, stderr, peak RSS of the process in MiB).

    The peak comes from ``/usr/bin/time``: a child's ``ru_maxrss`` seen from here would
    include this process's own peak (it carries over a vfork and exec)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        full = ["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd]
        start = time.perf_counter()
        proc = subprocess.Popen(
            full, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = Output(keep), Output(keep)
        readers = [
            threading.Thread(target=_read_all, args=(proc.stdout, out)),
            threading.Thread(target=_read_all, args=(proc.stderr, err)),
        ]
        for t in readers:
            t.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise TimeoutError(f"{cmd[1:4]} took over {timeout:.0f} s") from None
        elapsed = time.perf_counter() - start
        for t in readers:
            t.join()
        peak = int(rss.read().split()[-1]) // 1024
    return elapsed, out, err, peak


def seq_lines_exact(output: bytes) -> bool:
    """Whether the output holds ``sh/0 1`` .. ``sh/0 N`` in order (other lines ignored)."""
    found = re.findall(rb"^sh/0 (\d+)$", output, re.M)
    return len(found) == SEQ_N and found[0] == b"1" and found[-1] == str(SEQ_N).encode()


class SupervisorPeak:
    """Samples the peak resident memory (VmHWM) of our supervisors under ``home``."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.peak_mb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    exec_ed = b"torchx.schedulers.local.supervisor" in cmd
                    # a supervisor forked from the CLI keeps its command line, not its name
                    forked = Path(f"/proc/{pid}/comm").read_bytes() == b"torchx-local\n"
                    if forked:
                        cmd = Path(f"/proc/{pid}/environ").read_bytes()
                    if not (exec_ed or forked) or self.home.encode() not in cmd:
                        continue
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                m = re.search(r"VmHWM:\s+(\d+) kB", status)
                if m:
                    self.peak_mb = max(self.peak_mb, int(m[1]) // 1024)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def bench(impls: List[Impl], repeat: int, work: str, big: bool) -> List[str]:
    seq: Dict[str, List[float]] = {i.name: [] for i in impls}
    exact: Dict[str, bool] = {i.name: True for i in impls}
    last_handle = ""
    for r in range(repeat):
        for impl in impls if r % 2 == 0 else list(reversed(impls)):
            env = impl.env(os.path.join(work, impl.name))
            t, out, err, _ = run_checked(
                impl.torchx("run", "-s", "local_cwd", "utils.sh", "seq", str(SEQ_N)), env, work
            )
            seq[impl.name].append(t)
            exact[impl.name] &= seq_lines_exact(out.data() + b"\n" + err.data())
            if impl.name == "ours":
                last_handle = out.data().split(b"\n", 1)[0].decode()
    ours = impls[0]
    log_times = []
    log_exact = True
    for _ in range(repeat):
        env = ours.env(os.path.join(work, ours.name))
        t, out, _, _ = run_checked(ours.torchx("log", last_handle), env, work)
        log_times.append(t)
        log_exact &= seq_lines_exact(out.data())
    lines = [
        f"`torchx run -s local_cwd utils.sh seq {SEQ_N}`, median of {repeat} (every line checked):",
        "",
        "| case | ours (s) | upstream 0.7.0 (s) | speed-up |",
        "|---|---|---|---|",
    ]
    o, u = statistics.median(seq["ours"]), statistics.median(seq.get("upstream") or [0.0])
    lines.append(
        f"| run, {SEQ_N:,} lines | {o:.2f} | {u:.2f} | {u / o:.1f}x |"
        if u
        else f"| run, {SEQ_N:,} lines | {o:.2f} | n/a | n/a |"
    )
    lines.append(
        f"| `torchx log` of it from another process | {statistics.median(log_times):.2f}"
        " | never returns | n/a |"
    )
    lines += [
        "",
        "All lines exact: "
        + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in exact.items())
        + f"; `torchx log`: {'yes' if log_exact else 'NO'}.",
    ]
    if big:
        lines += ["", f"One line of {BIG_LINE // 1_000_000} MB (`utils.sh python3 -c ...`):", ""]
        lines += [
            "| impl | wall (s) | client peak RSS (MiB) | copier peak RSS (MiB) | output |",
            "|---|---|---|---|---|",
        ]
        for impl in impls:
            home = os.path.join(work, f"big-{impl.name}")
            env = impl.env(home)
            peak = SupervisorPeak(home) if impl.name == "ours" else None
            cmd = impl.torchx("run", "-s", "local_cwd", "utils.sh", "python3", "-c", BIG)
            try:
                t, out, err, client_mb = run_checked(cmd, env, work, keep=False)
            except TimeoutError as e:
                lines.append(f"| {impl.name} | > 900 | n/a | n/a | {e} |")
                continue
            copier = f"{peak.stop()}" if peak else "(in the client)"
            markers = out.counts[MARKER] + err.counts[MARKER]
            # x of the line: not those of the markers' or log lines' words (torchx, next)
            xs = sum(o.counts[b"x"] - o.counts[b"torchx"] - o.counts[b"next"] for o in (out, err))
            what = f"{xs:,} x" + (f" in {markers + 1} marked pieces" if markers else " in 1 line")
            lines.append(f"| {impl.name} | {t:.2f} | {client_mb} | {copier} | {what} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-big", action="store_true", help="skip the 200 MB line")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args()
    impls = [Impl("ours", OURS_BIN)]
    if (UPSTREAM_BIN / "torchx").exists():
        impls.append(Impl("upstream", UPSTREAM_BIN))
    with tempfile.TemporaryDirectory() as work:
        lines = bench(impls, args.repeat, work, not args.no_big)
    header = f"Generated by `benchmarks/bench_logs.py` on {time.strftime('%Y-%m-%d %H:%M')}."
    text = "\n".join([header, "", *lines])
    replace_section(Path(args.out), "Logs (local_cwd)", text)
    print(text)


if __name__ == "__main__":
    main()
