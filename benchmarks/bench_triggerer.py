"""N deferred stages in one event loop, run as Airflow's triggerer runs them.

Run: ``.venv/bin/python benchmarks/bench_triggerer.py`` (every case below), or one case:
``--case local_cwd --n 100 [--logs]``, ``--case slurm --n 1000``, ``--case datetime --n 100``.

Airflow's triggerer (``airflow/jobs/triggerer_job_runner.py``) runs every trigger of a
triggerer as a task of one asyncio loop (``TriggerRunner.run_trigger``); a child process
does the same here with N ``TorchXTrigger``s over N real apps, or N of Airflow's own
``DateTimeTrigger`` (the floor). Over a steady window it measures the child's CPU (its own
and its subprocesses', e.g. ``squeue``), its peak OS threads and RSS, the loop's worst lag
(a probe that sleeps 0.1 s and records the overshoot, as Airflow's ``block_watchdog``
does), and ``squeue`` calls per poll round (a PATH shim counts them). Then the apps end
(a flag file; on Slurm, the held jobs are cancelled) and it measures the delay from each
app's end (a file it touches as its last act, or the ``scancel``) to its trigger's event.

Apps:

- local_cwd: ``bash`` looping on ``read -t 1`` (no process per second), printing
  ``tick N`` each second with ``--logs``; each has its supervisor process.
- slurm (the shared cluster, ``scripts/slurm_cluster.sh``): the same script; the jobs are
  held right after submission (``scontrol hold``) so that N jobs do not take the other
  users' slots; the few that started first run until the flag. All are cancelled at the end.

Results go to the "Triggerer: N deferred stages" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_cli import replace_section  # noqa: E402

SECTION = "Triggerer: N deferred stages"
POLL = 5.0
WINDOW = 40.0
NICE = -10  # the triggerer's, as root (see run_case)
END_DEADLINE = 300.0

APP = (
    "exec 3<>{fifo}; i=0; while [ ! -e {flag} ]; do {echo}i=$((i+1)); read -t 1 -u 3; done; "
    "touch {ended}/{index}"
)


# ---------------------------------------------------------------- the triggerer (child)


def _threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _count(path: Optional[str]) -> int:
    if not path or not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def child(args: argparse.Namespace) -> None:
    """Run N triggers in one loop with Airflow's TriggerRunner; print one JSON line."""
    from airflow.sdk.log import configure_logging

    spec = json.loads(Path(args.child).read_text())
    # as the triggerer's runner process logs: JSON lines to its supervisor (here a file)
    log_file = open(Path(args.child).parent / "triggerer.log", "wb")  # noqa: SIM115
    configure_logging(json_output=True, output=log_file, sending_to_supervisor=True)
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    handles: List[str] = spec["handles"]
    counter = os.environ.get("BENCH_SQUEUE_COUNT")

    async def main() -> Dict[str, Any]:
        runner = TriggerRunner()
        lag = {"window": 0.0, "all": 0.0, "threads": 0}
        in_window = [False]
        overs: List[float] = []
        stop = asyncio.Event()

        async def probe() -> None:
            while not stop.is_set():
                before = time.monotonic()
                await asyncio.sleep(0.1)
                over = time.monotonic() - before - 0.1
                lag["all"] = max(lag["all"], over)
                if in_window[0]:
                    lag["window"] = max(lag["window"], over)
                    overs.append(over)
                lag["threads"] = max(lag["threads"], _threads())

        probe_task = asyncio.create_task(probe())
        fired: Dict[int, float] = {}
        payloads: Dict[int, Any] = {}
        tasks = []
        for i in range(len(handles)):
            trigger = _trigger(spec, i)
            runner.triggers[i] = {"name": f"t{i}", "events": 0, "is_watcher": False}
            task = asyncio.create_task(runner.run_trigger(i, trigger))
            runner.triggers[i]["task"] = task
            tasks.append(task)
            if i % 50 == 49:
                await asyncio.sleep(0)  # as create_triggers yields between triggers

        async def collect() -> None:
            while len(fired) < len(handles):
                while runner.events:
                    entry = runner.events.popleft()
                    fired.setdefault(entry.trigger_id, time.time())
                    payloads[entry.trigger_id] = entry.event.payload
                await asyncio.sleep(0.02)

        collector = asyncio.create_task(collect())
        poller = _poller()
        started = time.monotonic()
        await asyncio.sleep(POLL)
        while poller is not None and poller.unseen() and time.monotonic() - started < 600:
            await asyncio.sleep(0.5)  # every app had its first look (its own calls)
        await asyncio.sleep(POLL)
        startup = time.monotonic() - started
        rounds0, squeue0, cpu0 = _rounds(poller), _count(counter), _cpu()
        t0 = time.monotonic()
        in_window[0] = True
        lag["threads"] = _threads()
        await asyncio.sleep(args.window)
        in_window[0] = False
        window = time.monotonic() - t0
        cpu = _cpu() - cpu0
        rounds, squeues = _rounds(poller) - rounds0, _count(counter) - squeue0
        threads_window = lag["threads"]
        rss = _rss_mb()
        print("WINDOW_DONE", flush=True)
        ended_at = time.time()
        try:
            await asyncio.wait_for(collector, END_DEADLINE)
        except asyncio.TimeoutError:
            pass
        stop.set()
        await probe_task
        for task in tasks:
            task.cancel()
        return {
            "n": len(handles),
            "startup_s": round(startup, 1),
            "window_s": round(window, 1),
            "cpu_cores": cpu / window,
            "cpu_ms_per_stage_s": 1000 * cpu / window / len(handles),
            "peak_threads": threads_window,
            "peak_threads_all": lag["threads"],
            "rss_mb": rss,
            "worst_lag_window_s": lag["window"],
            "worst_lag_all_s": lag["all"],
            "lag_p99_window_s": sorted(overs)[int(0.99 * (len(overs) - 1))] if overs else None,
            "lags_over_0_2_s": sum(1 for o in overs if o >= 0.2),
            "rounds": rounds,
            "squeue_per_round": (squeues / rounds) if rounds else None,
            "squeue_per_poll": squeues / (window / POLL),
            "fired": {str(k): v for k, v in fired.items()},
            "states": sorted({str(p.get("state")) for p in payloads.values()})
            if payloads and isinstance(next(iter(payloads.values())), dict)
            else [],
            "ended_at": ended_at,
        }

    print("RESULT " + json.dumps(asyncio.run(main())), flush=True)


def _trigger(spec: Dict[str, Any], i: int) -> Any:
    if spec["case"] == "datetime":
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        moment = datetime.fromtimestamp(spec["moment"], tz=timezone.utc)
        return DateTimeTrigger(moment=moment)
    from torchx.pipelines.airflow.trigger import TorchXTrigger

    return TorchXTrigger(
        spec["handles"][i], poll_interval=POLL, get_logs=spec["logs"], progress_interval=None
    )


def _poller() -> Any:
    try:
        from torchx.pipelines.airflow.poller import TriggerPoller
    except ImportError:  # the version before the shared poller
        return None
    return TriggerPoller.of_running_loop()


def _rounds(poller: Any) -> int:
    return poller.rounds if poller is not None else 0


# ---------------------------------------------------------------- the apps (parent)


def _launch(case: str, n: int, logs: bool, work: Path) -> List[str]:
    from torchx.runner import get_runner

    fifo, flag, ended = work / "fifo", work / "flag", work / "ended"
    ended.mkdir(exist_ok=True)
    if not fifo.exists():
        os.mkfifo(fifo)
    echo = 'echo "tick $i"; ' if logs else ""
    cfg = {"time": "10"} if case == "slurm" else None  # minutes: nothing outlives a crash

    def one(i: int) -> str:
        script = APP.format(fifo=fifo, flag=flag, echo=echo, ended=ended, index=i)
        with get_runner() as runner:
            handle = runner.run_component("utils.sh", ["bash", "-c", script], case, cfg=cfg)
        if case == "slurm":  # at once: a queue of N jobs would hold up everyone else's
            subprocess.run(["scontrol", "hold", handle.rsplit("/", 1)[1]], capture_output=True)
        return handle

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(n)))


def _end(case: str, handles: List[str], work: Path) -> Dict[int, float]:
    """End every app; the time each ended (its marker file, or the scancel)."""
    (work / "flag").touch()
    ends: Dict[int, float] = {}
    if case == "slurm":
        ids = [h.rsplit("/", 1)[1] for h in handles]
        subprocess.run(["scancel", *ids], capture_output=True)
        cancelled = time.time()
        ends = {i: cancelled for i in range(len(handles))}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        marked = {int(p.name): p.stat().st_mtime for p in (work / "ended").iterdir()}
        ends.update(marked)
        if case != "local_cwd" or len(marked) == len(handles):
            break
        time.sleep(0.5)
    return ends


def _cleanup(case: str, handles: List[str]) -> None:
    if case == "slurm":
        ids = [h.rsplit("/", 1)[1] for h in handles]
        subprocess.run(["scancel", *ids], capture_output=True)
        return
    from torchx.runner import get_runner

    with get_runner() as runner:
        for app in runner.list("local_cwd"):
            if app.state.name not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                runner.cancel(app.app_handle)


def _shim(work: Path) -> Dict[str, str]:
    """A PATH whose ``squeue`` counts its calls into a file, then runs the real one."""
    real = shutil.which("squeue")
    shim = work / "shim"
    shim.mkdir(exist_ok=True)
    count = work / "squeue.calls"
    if real:
        (shim / "squeue").write_text(f'#!/bin/sh\necho >> "{count}"\nexec {real} "$@"\n')
        (shim / "squeue").chmod(0o755)
    return {"PATH": f"{shim}:{os.environ['PATH']}", "BENCH_SQUEUE_COUNT": str(count)}


def run_case(
    case: str, n: int, logs: bool, window: float, torchx_path: Optional[str] = None
) -> Dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"torchx-bench-triggerer-{case}-"))
    os.environ["TORCHX_HOME"] = str(work / "home")
    os.environ["TORCHX_TRACKERS"] = ""
    os.chdir(work)
    handles: List[str] = []
    proc = None
    try:
        t = time.monotonic()
        spec: Dict[str, Any] = {"case": case, "logs": logs}
        if case == "datetime":
            spec["moment"] = time.time() + POLL * 2 + window + 15
            handles = [f"datetime/{i}" for i in range(n)]
        else:
            handles = _launch(case, n, logs, work)
        spec["handles"] = handles
        launch_s = time.monotonic() - t
        (work / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, **_shim(work)}
        if torchx_path:  # another torchx's trigger (e.g. ``git archive`` of a commit)
            env["PYTHONPATH"] = torchx_path
        # the triggerer at a higher priority than the N apps (and their supervisors) that
        # share its 2 cores here: on its own machine it would not compete with them
        cmd = ["nice", "-n", str(NICE)] if NICE and os.geteuid() == 0 else []
        cmd += [sys.executable, __file__, "--child", str(work / "spec.json")]
        cmd += ["--window", str(window)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        result: Dict[str, Any] = {}
        ends: Dict[int, float] = {}
        for line in proc.stdout:
            if line.startswith("WINDOW_DONE") and case != "datetime":
                ends = _end(case, handles, work)
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        proc.wait()
        if case == "datetime":
            ends = {i: spec["moment"] for i in range(n)}
        fired = {int(k): v for k, v in result.pop("fired", {}).items()}
        delays = sorted(fired[i] - ends[i] for i in fired if i in ends)
        result.update(
            case=case,
            logs=logs,
            launch_s=round(launch_s, 1),
            events=len(fired),
            delay_median_s=delays[len(delays) // 2] if delays else None,
            delay_max_s=delays[-1] if delays else None,
            load=os.getloadavg()[0],
            torchx=torchx_path or "this",
        )
        return result
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if handles and case != "datetime":
            _cleanup(case, handles)


CASES = [
    ("datetime", 100, False),
    ("local_cwd", 100, False),
    ("local_cwd", 100, True),
    ("slurm", 100, False),
    ("datetime", 1000, False),
    ("local_cwd", 1000, False),
    ("local_cwd", 1000, True),
    ("slurm", 1000, False),
]


def _row(r: Dict[str, Any]) -> str:
    name = {"datetime": "Airflow `DateTimeTrigger`", "local_cwd": "local_cwd", "slurm": "Slurm"}
    version = "" if r.get("torchx", "this") == "this" else " (before)"
    logs = "lines/s" if r["logs"] else "quiet"
    p99 = f"{r['lag_p99_window_s']:.3f}" if r.get("lag_p99_window_s") is not None else "-"
    per_poll = r.get("squeue_per_poll", r.get("squeue_per_round"))
    squeue = f"{per_poll:.1f}" if r["case"] == "slurm" and per_poll is not None else "-"
    delay = (
        f"{r['delay_median_s']:.1f} / {r['delay_max_s']:.1f}"
        if r.get("delay_max_s") is not None
        else "-"
    )
    return (
        f"| {name[r['case']]}{version} | {r['n']} | {logs} | {r['cpu_cores']:.3f} "
        f"| {r['cpu_ms_per_stage_s']:.3f} | {r['peak_threads']} | {r['rss_mb']:.0f} "
        f"| {r['worst_lag_window_s']:.3f} / {r['worst_lag_all_s']:.3f} | {p99} | {squeue} "
        f"| {delay} | {r['events']}/{r['n']} | {r['load']:.1f} |"
    )


def write(results: List[Dict[str, Any]], path: Path) -> str:
    lines = [
        f"`benchmarks/bench_triggerer.py`, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
        f"{os.cpu_count()} cores shared with other work (load average in the last column, "
        f"1 min, at the case's end). Poll interval {POLL:g} s; a {WINDOW:g} s steady window "
        "after every trigger started and had its first look. The triggerer process runs at "
        f"nice {NICE} (here the N apps and their supervisors share its cores; in a deployment "
        "they run elsewhere). CPU: the triggerer process and its subprocesses "
        "(`squeue`, `sacct`). Lag: the loop's worst overshoot of a 0.1 s sleep, in the "
        "window / over the whole run (start-up of N triggers included). Delay: app's end "
        "to its trigger's event, median / max.",
        "",
        "| triggers | N | apps' output | CPU (cores) | CPU ms per stage per s "
        "| peak threads | RSS (MB) | worst lag (s) | lag p99 (s) | squeue per 5 s | delay (s) "
        "| events | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *[_row(r) for r in results],
    ]
    body = "\n".join(lines)
    replace_section(path, SECTION, body)
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=["datetime", "local_cwd", "slurm"])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--logs", action="store_true")
    parser.add_argument("--window", type=float, default=WINDOW)
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS")
    parser.add_argument("--torchx-path", help="run the triggers of the torchx found here")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    cases = [(args.case, args.n, args.logs)] if args.case else CASES
    results = []
    for case, n, logs in cases:
        result = run_case(case, n, logs, args.window, args.torchx_path)
        print(json.dumps(result), flush=True)
        results.append(result)
    if not args.no_write:
        print(write(results, ROOT / "benchmarks" / "RESULTS.md"))


if __name__ == "__main__":
    main()
