"""Side-by-side speed of this torchx vs upstream torchx 0.7.0 (and plain torchrun).

Run: ``bash benchmarks/run.sh`` (sets up the upstream venv, then runs this and, at
its end, ``bench_logs.py``).
Each case runs both implementations interleaved, N times, and reports medians,
so machine noise hits both alike. Results go to ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
# both installed alike by setup_upstream.sh: non-editable and byte-compiled, as a user's
# `pip install` leaves them (the dev .venv's editable hook and a tree without __pycache__
# add start-up time no user pays); ours is reinstalled from this checkout each setup
OURS_BIN = ROOT / "benchmarks" / ".venvs" / "ours" / "bin"
UPSTREAM_BIN = ROOT / "benchmarks" / ".venvs" / "upstream" / "bin"


@dataclass
class Impl:
    name: str
    bin: Path

    def env(self, home: str) -> Dict[str, str]:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # each venv runs its own installed torchx
        env["PATH"] = f"{self.bin}:{env.get('PATH', '')}"
        env["TORCHX_HOME"] = home
        env.pop("TORCHXCONFIG", None)
        env["HOME"] = home
        return env

    def torchx(self, *args: str) -> List[str]:
        return [str(self.bin / "torchx"), *args]

    def python(self, *args: str) -> List[str]:
        return [str(self.bin / "python"), *args]


@dataclass
class Result:
    case: str
    times: Dict[str, List[float]] = field(default_factory=dict)
    note: str = ""

    def median(self, impl: str) -> Optional[float]:
        t = self.times.get(impl)
        return statistics.median(t) if t else None


def timed(cmd: List[str], env: Dict[str, str], cwd: str, check_out: Optional[str] = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if check_out is not None and check_out not in proc.stdout:
        raise RuntimeError(
            f"{cmd}: expected {check_out!r} in output, got rc={proc.returncode}\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return elapsed


def run_case(
    name: str,
    impls: List[Impl],
    make_cmd: Callable[[Impl], List[str]],
    repeat: int,
    work: str,
    check_out: Optional[str] = None,
) -> Result:
    res = Result(name)
    for i in range(repeat):
        for impl in impls if i % 2 == 0 else reversed(impls):
            t = timed(make_cmd(impl), impl.env(os.path.join(work, impl.name)), work, check_out)
            res.times.setdefault(impl.name, []).append(t)
    return res


RUNNER_WAIT = textwrap.dedent(
    """
    import sys, time
    from torchx import specs
    from torchx.runner import get_runner
    app = specs.AppDef(name="t", roles=[specs.Role(name="t", image=".", entrypoint="true",
                       num_replicas=int(sys.argv[1]), resource=specs.resource(cpu=1))])
    if len(sys.argv) > 2:
        app.roles[0].entrypoint = "sleep"; app.roles[0].args = [sys.argv[2]]
    with get_runner() as r:
        start = time.perf_counter()
        h = r.run(app, "local_cwd")
        s = r.wait(h)  # default wait_interval (upstream: 10 s)
        print(f"{time.perf_counter() - start:.4f}", s.state)
    """
)


def runner_case(name: str, impls: List[Impl], repeat: int, work: str, *argv: str) -> Result:
    res = Result(
        name, note="measured inside the process: Runner.run + Runner.wait(default interval)"
    )
    for _ in range(repeat):
        for impl in impls:
            out = subprocess.run(
                impl.python("-c", RUNNER_WAIT, *argv),
                env=impl.env(os.path.join(work, impl.name)),
                cwd=work,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if "SUCCEEDED" not in out.stdout:
                raise RuntimeError(f"{impl.name} runner case failed: {out.stdout}{out.stderr}")
            res.times.setdefault(impl.name, []).append(float(out.stdout.split()[0]))
    return res


def lost_output(impls: List[Impl], n: int, work: str) -> Dict[str, int]:
    lost: Dict[str, int] = {}
    for impl in impls:
        env = impl.env(os.path.join(work, impl.name))
        misses = 0
        for _ in range(n):
            p = subprocess.run(
                impl.torchx("run", "-s", "local_cwd", "utils.echo", "--msg", "hi"),
                env=env,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if not any(
                line.rstrip().endswith("hi")
                for line in p.stdout.splitlines() + p.stderr.splitlines()
            ):
                misses += 1
                if impl.name == "ours":  # say what happened, so it can be fixed
                    print(
                        f"ours missed 'hi': rc={p.returncode} stdout={p.stdout[-300:]!r}"
                        f" stderr={p.stderr[-1500:]!r}",
                        file=sys.stderr,
                    )
        lost[impl.name] = misses
    return lost


DDP_SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1000)
    for _ in range(50):
        dist.all_reduce(t)
    dist.barrier()
    print("rank", dist.get_rank(), "done")
    dist.destroy_process_group()
    """
)


def ddp_ratio(ours: Impl, repeat: int, work: str) -> Result:
    script = Path(work) / "ddp_bench.py"
    script.write_text(DDP_SCRIPT)
    res = Result("dist.ddp -j 1x2 vs torchrun --nproc_per_node 2 (wall)")
    env = ours.env(os.path.join(work, "ddp"))
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmds = {
        "torchx dist.ddp": ours.torchx(
            "run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--script", str(script)
        ),
        "plain torchrun": [
            str(ours.bin / "torchrun"),
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "localhost:0",
            str(script),
        ],
    }
    for i in range(repeat):
        for name in list(cmds) if i % 2 == 0 else list(reversed(cmds)):
            res.times.setdefault(name, []).append(timed(cmds[name], env, work))
    return res


def replace_section(path: Path, title: Optional[str], body: str) -> None:
    """Write ``body`` as the ``## title`` section of ``path`` (None: the part before the
    first section), keeping every other section as it is; a new section goes last."""
    text = path.read_text() if path.exists() else ""
    parts = re.split(r"(?m)^## ", text)
    head, sections = parts[0], ["## " + p for p in parts[1:]]
    if title is None:
        head = body.rstrip("\n") + "\n\n"
    else:
        new = f"## {title}\n\n{body.rstrip()}\n\n"
        for i, sec in enumerate(sections):
            if sec.split("\n", 1)[0].strip() == f"## {title}":
                sections[i] = new
                break
        else:
            sections.append(new)
    path.write_text((head + "".join(sections)).rstrip("\n") + "\n")


def write_results(
    results: List[Result], lost: Dict[str, int], n_lost: int, ddp: Optional[Result], path: Path
) -> str:
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `benchmarks/bench_cli.py` on {time.strftime('%Y-%m-%d %H:%M')} "
        f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}).",
        "Both implementations run interleaved in the same run; medians of the repeats.",
        "",
        "| case | ours (s) | upstream 0.7.0 (s) | speed-up |",
        "|---|---|---|---|",
    ]
    for r in results:
        o, u = r.median("ours"), r.median("upstream")
        speed = f"{u / o:.1f}x" if o and u else "n/a"
        lines.append(
            f"| {r.case} | {o:.3f} | {u:.3f} | {speed} |"
            if o and u
            else f"| {r.case} | {o} | {u} | n/a |"
        )
    lines += [
        "",
        f"Lost output: `torchx run -s local_cwd utils.echo --msg hi` x{n_lost},"
        " runs that did not print `hi`:",
        "",
    ]
    for name, misses in lost.items():
        lines.append(f"- {name}: {misses} of {n_lost}")
    text = "\n".join(lines) + "\n"
    replace_section(path, None, text)
    if ddp is not None:
        a, b = ddp.median("torchx dist.ddp"), ddp.median("plain torchrun")
        ddp_text = (
            f"- `torchx run -s local_cwd dist.ddp -j 1x2`: {a:.2f} s;"
            f" plain `torchrun --nproc_per_node 2`: {b:.2f} s;"
            f" ratio **{a / b:.3f}** (upstream measured 1.12; target <= 1.03)"
        )
        replace_section(path, "dist.ddp overhead", ddp_text)
        text += "\n## dist.ddp overhead\n\n" + ddp_text + "\n"
    return text


def cli_cases(impls: List[Impl], r: int, work: str) -> List[Result]:
    """The CLI start-up cases (processes), each interleaved ours/upstream."""
    return [
        run_case(
            "python -c 'import torchx.runner' (process)",
            impls,
            lambda i: i.python("-c", "import torchx.runner"),
            r,
            work,
        ),
        run_case(
            "python -c 'import torchx.specs' (process)",
            impls,
            lambda i: i.python("-c", "import torchx.specs"),
            r,
            work,
        ),
        run_case("torchx --help", impls, lambda i: i.torchx("--help"), r, work),
        run_case("torchx builtins", impls, lambda i: i.torchx("builtins"), r, work),
        run_case(
            "torchx run --dryrun -s local_cwd utils.echo",
            impls,
            lambda i: i.torchx("run", "--dryrun", "-s", "local_cwd", "utils.echo", "--msg", "hi"),
            r,
            work,
        ),
        run_case(
            "torchx run -s local_cwd utils.echo --msg hi",
            impls,
            lambda i: i.torchx("run", "-s", "local_cwd", "utils.echo", "--msg", "hi"),
            r,
            work,
        ),
        run_case(
            "torchx run -s local_cwd utils.sh sleep 0.2",
            impls,
            lambda i: i.torchx("run", "-s", "local_cwd", "utils.sh", "sleep", "0.2"),
            r,
            work,
        ),
    ]


def update_cli_rows(results: List[Result], path: Path, note: str) -> str:
    """Replace the rows of ``results``' cases in the table at the top of ``path`` and say
    when (the other rows, and the other sections, stay as they are)."""
    text = path.read_text()
    lines = text.split("\n")
    for r in results:
        o, u = r.median("ours"), r.median("upstream")
        row = f"| {r.case} | {o:.3f} | {u:.3f} | {u / o:.1f}x |" if o and u else None
        for i, line in enumerate(lines):
            if row and line.startswith(f"| {r.case} |"):
                lines[i] = row
    out = "\n".join(lines)
    out = re.sub(r"(?m)^CLI rows re-measured .*\n\n?", "", out)
    marker = "Lost output:"
    out = out.replace(marker, note + "\n\n" + marker, 1) if marker in out else out + note
    path.write_text(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--lost-runs", type=int, default=200)
    parser.add_argument("--no-ddp", action="store_true")
    parser.add_argument("--no-logs", action="store_true", help="skip bench_logs.py")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    parser.add_argument(
        "--cli-only",
        action="store_true",
        help="only the CLI start-up cases; updates their rows in RESULTS.md",
    )
    parser.add_argument(
        "--ours-bin",
        default=str(OURS_BIN),
        help="bin/ of the venv with our torchx (e.g. a private copy installed from a worktree)",
    )
    parser.add_argument("--upstream-bin", default=str(UPSTREAM_BIN))
    args = parser.parse_args()

    ours = Impl("ours", Path(args.ours_bin))
    upstream = Impl("upstream", Path(args.upstream_bin))
    impls = [ours, upstream]
    if args.cli_only:
        with tempfile.TemporaryDirectory() as work:
            load0 = os.getloadavg()[0]
            results = cli_cases(impls, args.repeat, work)
            load1 = os.getloadavg()[0]
        for r in results:
            spread = {k: f"{min(v):.3f}-{max(v):.3f}" for k, v in r.times.items()}
            print(r.case, {k: round(r.median(k) or 0, 3) for k in r.times}, spread)
        note = (
            f"CLI rows re-measured {time.strftime('%Y-%m-%d %H:%M')} with `--cli-only`"
            f" ({args.repeat} interleaved repeats, medians; load average {load0:.1f} at the"
            f" start, {load1:.1f} at the end)."
        )
        update_cli_rows(results, Path(args.out), note)
        return
    with tempfile.TemporaryDirectory() as work:
        r = args.repeat
        results = [
            *cli_cases(impls, r, work),
            runner_case("Runner.run(true) + wait()", impls, r, work, "1"),
            runner_case(
                "32 replicas of sleep 1: run + wait()", impls, max(3, r // 2), work, "32", "1"
            ),
        ]
        lost = lost_output(impls, args.lost_runs, work)
        ddp = None if args.no_ddp else ddp_ratio(ours, max(3, r // 2), work)
        print(write_results(results, lost, args.lost_runs, ddp, Path(args.out)))
    if not args.no_logs:
        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_logs.py"), "--out", args.out],
            check=True,
        )


if __name__ == "__main__":
    sys.exit(main())
