"""What MLflow tracking costs a job, side by side with tracking off (the budgets:
at most +0.3 s per ``torchx run`` over http, at most +2.5 s on the embedded sqlite store).

1. ``torchx run -s local_cwd utils.python --c "print('hi')"``: wall time of the CLI (it
   waits for a local app), tracking off / MLflow on a sqlite store (existing, and a new
   one per run, made from the schema snapshot) / MLflow on a real ``mlflow server``
   (REST), interleaved, medians. The run is opened before the submit and ended in the
   CLI's own process; the CLI's own CPU time (user+sys of it and its children) is
   reported beside wall time, since wall time on a shared 2-core machine moves with the
   load.
2. ``torchx run -s local_cwd dist.ddp -j 1x2`` of a script that calls the tracker before
   its first DDP step: per rank, seconds from the rank's process start to the end of its
   first step, and the time spent in the tracker calls themselves (rows on sqlite, REST
   over http: no ``import mlflow`` in the rank).

Each tracked job is checked to have exactly one FINISHED MLflow run.
Results replace the "Tracking overhead" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_cli import OURS_BIN, ROOT, replace_section  # noqa: E402

# the benchmark venv's torchx if set up (benchmarks/run.sh), else this interpreter's
TORCHX = (
    str(OURS_BIN / "torchx")
    if (OURS_BIN / "torchx").exists()
    else str(Path(sys.executable).parent / "torchx")
)
SECTION = "Tracking overhead"
NEW_STORE = "mlflow sqlite, new store"  # a store file per run: {i} in its URI

DDP_SCRIPT = """
import json, os, time
import psutil
import torch
import torch.distributed as dist
from torchx.tracker import app_run_from_env

dist.init_process_group("gloo")
t0 = time.time()
run = app_run_from_env()
run.add_metadata(rank=os.environ["RANK"])
run.log_metrics({"ready": 1.0}, step=0)
calls = time.time() - t0
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
loss = model(torch.randn(16, 8)).sum()
loss.backward()
first = time.time() - psutil.Process().create_time()
run.log_metrics({"loss": float(loss)}, step=1)
with open(os.path.join(OUT, "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"to_first_step": first, "tracker_calls": calls}, f)
"""


def busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy (every process, ours or not)."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def env_for(mode: str, home: str, uri: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ, TORCHX_HOME=home)
    for k in ("TORCHX_TRACKERS", "TORCHX_TRACKER_MLFLOW_CONFIG", "TORCHX_PARENT_RUN_ID"):
        env.pop(k, None)
    if mode != "off":
        env.update(TORCHX_TRACKERS="mlflow", TORCHX_TRACKER_MLFLOW_CONFIG=str(uri))
    return env


CPU: Dict[str, List[float]] = {}  # mode -> CPU seconds of each timed `torchx run`


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(args: List[str], env: Dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    out = subprocess.run(
        [TORCHX, "run", "-s", "local_cwd", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    took = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"torchx run {args} failed: {out.stderr[-2000:]}")
    return took


def finished_runs(uri: str) -> int:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, max_results=10000) if exps else []
    ids = [r.data.tags.get("torchx.job_id") for r in runs if r.info.status == "FINISHED"]
    assert len(ids) == len(set(ids)), "a job has two runs"
    return len(ids)


def bench_run(modes: Dict[str, Optional[str]], repeat: int, work: str) -> Dict[str, List[float]]:
    times: Dict[str, List[float]] = {m: [] for m in modes}
    for i in range(repeat + 1):  # the first round warms caches and is dropped
        for mode, uri in modes.items():
            uri = uri.format(i=i) if uri else uri
            env = env_for(mode, os.path.join(work, "home-" + mode), uri)
            cpu = _children_cpu()
            t = timed_run(["utils.python", "--c", "print('hi')"], env, work)
            if i:
                times[mode].append(t)
                CPU.setdefault(mode, []).append(_children_cpu() - cpu)
    return times


def bench_ddp(
    modes: Dict[str, Optional[str]], repeat: int, work: str
) -> Dict[str, Dict[str, List[float]]]:
    out: Dict[str, Dict[str, List[float]]] = {
        m: {"to_first_step": [], "tracker_calls": [], "cpu": []} for m in modes if m != NEW_STORE
    }
    for i in range(repeat):
        for mode, uri in modes.items():
            if mode == NEW_STORE:
                continue
            res = os.path.join(work, f"ddp-{mode}-{i}")
            os.makedirs(res)
            script = os.path.join(res, "train.py")
            Path(script).write_text(f"OUT = {res!r}\n" + DDP_SCRIPT)
            env = env_for(mode, os.path.join(work, "home-" + mode), uri)
            busy = busy_cpu()
            timed_run(["dist.ddp", "-j", "1x2", "--script", script], env, work)
            out[mode]["cpu"].append(busy_cpu() - busy)
            for rank in ("0", "1"):
                with open(os.path.join(res, f"rank{rank}.json")) as f:
                    data = json.load(f)
                for k in ("to_first_step", "tracker_calls"):
                    out[mode][k].append(data[k])
    return out


def med(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(
    run: Dict[str, List[float]],
    ddp: Dict[str, Dict[str, List[float]]],
    repeat: int,
    ddp_repeat: int,
    runs_ok: str,
) -> str:
    off = med(run["off"])
    lines = [
        f"Generated by `benchmarks/bench_tracking.py` on {time.strftime('%Y-%m-%d %H:%M')}"
        f" ({platform.machine()}, {os.cpu_count()} cores, load average"
        f" {os.getloadavg()[0]:.1f} at the end). Medians; tracking on vs off in the same run.",
        "",
        f"`torchx run -s local_cwd utils.python --c \"print('hi')\"` ({repeat} runs each):",
        "",
        "| tracking | wall (s) | added (s) | target | CLI CPU (s) | added CPU (s) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, xs in run.items():
        budget = 0.3 if "http" in mode else 2.5
        added = "" if mode == "off" else f"{med(xs) - off:+.3f}"
        target = (
            ""
            if mode == "off"
            else f"<= +{budget} s: " + ("met" if med(xs) - off <= budget else "**missed**")
        )
        cpu, cpu_off = med(CPU.get(mode, [])), med(CPU.get("off", []))
        added_cpu = "" if mode == "off" else f"{cpu - cpu_off:+.3f}"
        lines.append(f"| {mode} | {med(xs):.3f} | {added} | {target} | {cpu:.3f} | {added_cpu} |")
    lines += [
        "",
        f"`dist.ddp -j 1x2`, per rank ({ddp_repeat} jobs each, 2 ranks per job): seconds from"
        " the rank's process start to the end of its first DDP step, and in the tracker calls"
        " made before that step (a tag and a metric: rows on sqlite, REST over http, no"
        " `import mlflow` in the rank); and the CPU the whole machine spent per job:",
        "",
        "| tracking | to first step (s) | range (s) | added (s) | in tracker calls (s)"
        " | machine CPU per job (s) |",
        "|---|---|---|---|---|---|",
    ]
    ddp_off = med(ddp["off"]["to_first_step"])
    for mode, d in ddp.items():
        first = med(d["to_first_step"])
        added = "" if mode == "off" else f"{first - ddp_off:+.3f}"
        spread = f"{min(d['to_first_step']):.2f}-{max(d['to_first_step']):.2f}"
        calls = med(d["tracker_calls"])
        cpu = med(d["cpu"])
        lines.append(f"| {mode} | {first:.3f} | {spread} | {added} | {calls:.3f} | {cpu:.1f} |")
    lines += [
        "",
        "How: no daemon and no background process. The Runner opens the job's run before"
        " it submits the job and puts `MLFLOW_RUN_ID`, `MLFLOW_TRACKING_URI`,"
        " `MLFLOW_EXPERIMENT_ID` in every role's env; it ends the run in-process when it sees"
        " the app end. Over http: a few REST calls. On sqlite whose schema is the installed"
        " MLflow's head: a few `sqlite3` rows, as MLflow writes them (no `import mlflow` in"
        " the CLI). A new store (the 'new store' row) is created in the CLI's process, under"
        " the store's lock, from a snapshot of the schema the installed MLflow creates for its"
        " alembic head (`torchx/trackers/mlflow_schema.json`, made by"
        " `scripts/mlflow_schema.py`): built in a temp file, then linked into place, so a"
        " reader sees no store or a whole one. For another head (an MLflow other than the"
        " pinned one) MLflow creates it the same way (`import mlflow` plus its migrations,"
        " about 5 s of CPU per new store). In a rank, torchx's own tracker calls are"
        " rows on sqlite and REST over http: nothing imports mlflow unless the user's code"
        " does.",
        "",
        f"Check: {runs_ok}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ddp-repeat", type=int, default=3)
    parser.add_argument("--no-http", action="store_true", help="skip the mlflow server case")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args()
    from tests.mlflow_server import mlflow_server

    with tempfile.TemporaryDirectory() as work:
        sqlite = f"sqlite:///{work}/mlflow.db"
        from mlflow import MlflowClient

        MlflowClient(sqlite).search_experiments()  # this store's schema exists before timing
        modes: Dict[str, Optional[str]] = {
            "off": None,
            "mlflow sqlite": sqlite,
            NEW_STORE: f"sqlite:///{work}/new-{{i}}.db",
        }
        with mlflow_server(os.path.join(work, "server")) if not args.no_http else _none() as url:
            if url:
                modes["mlflow http (REST)"] = url
            run = bench_run(modes, args.repeat, work)
            ddp = bench_ddp(modes, args.ddp_repeat, work)
            expected = args.repeat + 1 + args.ddp_repeat
            counts = {m: finished_runs(str(u)) for m, u in modes.items() if u and m != NEW_STORE}
            new = sum(
                finished_runs(str(modes[NEW_STORE]).format(i=i)) for i in range(args.repeat + 1)
            )
        runs_ok = (
            ", ".join(
                f"{m}: {n} of {expected} tracked jobs have one FINISHED run"
                for m, n in counts.items()
            )
            + f", {NEW_STORE}: {new} of {args.repeat + 1}"
        )
    text = report(run, ddp, args.repeat, args.ddp_repeat, runs_ok)
    replace_section(Path(args.out), SECTION, text)
    print(text)


class _none:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
