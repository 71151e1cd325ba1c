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
import gc
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
# local_cwd apps end over this many seconds after the flag, app i after i/N of it: stages
# of one triggerer do not all end in one second, and 1,000 supervisors recording their
# app's end at once would take this 2-core machine (that the triggerer shares here) whole
SPREAD = 10.0

APP = (
    "exec 3<>{fifo}; i=0; while [ ! -e {flag} ]; do {echo}i=$((i+1)); read -t 1 -u 3; done; "
    "read -t {linger} -u 3; touch {ended}/{index}"
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


def _own_cpu() -> float:
    """CPU seconds of this process's threads (not its children)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


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
        lag = {"startup": 0.0, "window": 0.0, "end": 0.0, "all": 0.0, "threads": 0}
        # the same less the garbage collections' pauses inside the lag (the heap's, mostly
        # Airflow's, whoever allocated last)
        own = {"startup": 0.0, "window": 0.0, "end": 0.0}
        # the process's CPU seconds during each phase's worst lag: near the lag, the loop or
        # its threads were working; near 0, the process waited for a core (starved)
        busy = {"startup": 0.0, "window": 0.0, "end": 0.0}
        phase = ["startup"]
        overs: List[float] = []
        stop = asyncio.Event()
        pauses = _gc_pauses()

        async def probe() -> None:
            while not stop.is_set():
                before, collecting, cpu = time.monotonic(), pauses["total"], _own_cpu()
                await asyncio.sleep(0.1)
                over = time.monotonic() - before - 0.1
                lag["all"] = max(lag["all"], over)
                if over > lag[phase[0]]:
                    lag[phase[0]], busy[phase[0]] = over, _own_cpu() - cpu
                own[phase[0]] = max(own[phase[0]], over - (pauses["total"] - collecting))
                if phase[0] == "window":
                    overs.append(over)
                lag["threads"] = max(lag["threads"], _threads())

        probe_task = asyncio.create_task(probe())
        fired: Dict[int, float] = {}
        payloads: Dict[int, Any] = {}
        tasks = []
        for i in range(len(handles)):
            # as Airflow's create_triggers: it yields before each trigger and again after
            # loading its class, so the loop runs other work between trigger starts
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            trigger = _trigger(spec, i)
            runner.triggers[i] = {"name": f"t{i}", "events": 0, "is_watcher": False}
            task = asyncio.create_task(runner.run_trigger(i, trigger))
            runner.triggers[i]["task"] = task
            tasks.append(task)

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
        full0 = pauses["full"]
        t0 = time.monotonic()
        phase[0] = "window"
        lag["threads"] = _threads()
        await asyncio.sleep(args.window)
        phase[0] = "end"
        window = time.monotonic() - t0
        cpu = _cpu() - cpu0
        rounds, squeues = _rounds(poller) - rounds0, _count(counter) - squeue0
        full_window = pauses["full"] - full0
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
        windowed = [d for t, d in _round_times(poller) if t0 <= t < t0 + window]
        ending = [d for t, d in _round_times(poller) if t >= t0 + window]
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
            "worst_lag_startup_s": lag["startup"],
            "worst_lag_end_s": lag["end"],
            "slowest_round_window_s": max(windowed, default=None),
            "slowest_round_end_s": max(ending, default=None),
            "lag_p99_window_s": sorted(overs)[int(0.99 * (len(overs) - 1))] if overs else None,
            "lags_over_0_2_s": sum(1 for o in overs if o >= 0.2),
            "gc_worst_s": pauses["worst"],
            "gc_full_collections_window": full_window,
            "worst_own_lag_s": own,
            "worst_lag_cpu_s": busy,
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


def _gc_pauses() -> Dict[str, Any]:
    """The interpreter's garbage collections from now on (each stops every thread, the
    loop's too): the worst pause, their total time and the number of full (generation 2)
    ones."""
    pauses: Dict[str, Any] = {"worst": 0.0, "total": 0.0, "full": 0}
    began = [0.0]

    def on_gc(phase: str, info: Dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.monotonic()
            return
        pause = time.monotonic() - began[0]
        pauses["worst"] = max(pauses["worst"], pause)
        pauses["total"] += pause
        pauses["full"] += info["generation"] == 2

    gc.callbacks.append(on_gc)
    return pauses


def _trigger(spec: Dict[str, Any], i: int) -> Any:
    if spec["case"] == "datetime":
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        moment = datetime.fromtimestamp(_moment(spec, i), tz=timezone.utc)
        return DateTimeTrigger(moment=moment)
    from torchx.pipelines.airflow.trigger import TorchXTrigger

    return TorchXTrigger(
        spec["handles"][i], poll_interval=POLL, get_logs=spec["logs"], progress_interval=None
    )


def _moment(spec: Dict[str, Any], i: int) -> float:
    """When the i-th ``DateTimeTrigger`` fires: spread as the apps' ends are."""
    return float(spec["moment"]) + spec["spread"] * i / len(spec["handles"])


def _poller() -> Any:
    try:
        from torchx.pipelines.airflow.poller import TriggerPoller
    except ImportError:  # the version before the shared poller
        return None
    return TriggerPoller.of_running_loop()


def _rounds(poller: Any) -> int:
    return poller.rounds if poller is not None else 0


def _round_times(poller: Any) -> List[Any]:
    return list(getattr(poller, "round_times", []))  # older pollers have none


# ---------------------------------------------------------------- the apps (parent)


def _launch(case: str, n: int, logs: bool, spread: float, work: Path) -> List[str]:
    from torchx.runner import get_runner

    fifo, flag, ended = work / "fifo", work / "flag", work / "ended"
    ended.mkdir(exist_ok=True)
    if not fifo.exists():
        os.mkfifo(fifo)
    echo = 'echo "tick $i"; ' if logs else ""
    cfg = {"time": "10"} if case == "slurm" else None  # minutes: nothing outlives a crash

    def one(i: int) -> str:
        linger = f"{spread * i / n:.2f}"
        script = APP.format(fifo=fifo, flag=flag, echo=echo, ended=ended, index=i, linger=linger)
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


def _recorded_ends(case: str, handles: List[str], work: Path) -> Dict[int, float]:
    """When local_cwd recorded each app's end (its supervisor's ``state.json``): what any
    reader of the scheduler, a trigger included, can see first."""
    ends = {}
    for i, handle in enumerate(handles):
        app_id = handle.rsplit("/", 1)[1]
        for state in (work / "home" / case).glob(f"*/{app_id}/state.json"):
            ends[i] = json.loads(state.read_text())["updated"]
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
    case: str,
    n: int,
    logs: bool,
    window: float,
    spread: float = SPREAD,
    torchx_path: Optional[str] = None,
) -> Dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"torchx-bench-triggerer-{case}-"))
    os.environ["TORCHX_HOME"] = str(work / "home")
    os.environ["TORCHX_TRACKERS"] = ""
    os.chdir(work)
    handles: List[str] = []
    proc = None
    try:
        t = time.monotonic()
        spread = 0.0 if case == "slurm" else spread  # one scancel ends the held jobs
        spec: Dict[str, Any] = {"case": case, "logs": logs, "spread": spread}
        if case == "datetime":
            spec["moment"] = time.time() + POLL * 2 + window + 15
            handles = [f"datetime/{i}" for i in range(n)]
        else:
            handles = _launch(case, n, logs, spread, work)
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
            ends = {i: _moment(spec, i) for i in range(n)}
        fired = {int(k): v for k, v in result.pop("fired", {}).items()}
        delays = sorted(fired[i] - ends[i] for i in fired if i in ends)
        recorded = _recorded_ends(case, handles, work) if case == "local_cwd" else ends
        after_record = sorted(fired[i] - recorded[i] for i in fired if i in recorded)
        result.update(
            case=case,
            logs=logs,
            spread_s=spread,
            launch_s=round(launch_s, 1),
            events=len(fired),
            delay_median_s=delays[len(delays) // 2] if delays else None,
            delay_max_s=delays[-1] if delays else None,
            recorded_delay_median_s=after_record[len(after_record) // 2] if after_record else None,
            recorded_delay_max_s=after_record[-1] if after_record else None,
            load=os.getloadavg()[0],
            torchx=torchx_path or "this",
        )
        return result
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if handles and case != "datetime":
            _cleanup(case, handles)


# (case, N, logs, spread of the ends in seconds)
CASES = [
    ("datetime", 100, False, SPREAD),
    ("local_cwd", 100, False, SPREAD),
    ("local_cwd", 100, True, SPREAD),
    ("slurm", 100, False, 0.0),
    ("datetime", 1000, False, SPREAD),
    ("local_cwd", 1000, False, SPREAD),
    ("local_cwd", 1000, True, SPREAD),
    ("local_cwd", 1000, True, 0.0),  # every app ends in the same second
    ("slurm", 1000, False, 0.0),
]


def _row(r: Dict[str, Any]) -> str:
    name = {"datetime": "Airflow `DateTimeTrigger`", "local_cwd": "local_cwd", "slurm": "Slurm"}
    version = "" if r.get("torchx", "this") == "this" else " (before)"
    logs = "lines/s" if r["logs"] else "quiet"

    def s(key: str, digits: int = 3) -> str:
        return "-" if r.get(key) is None else f"{r[key]:.{digits}f}"

    squeue = s("squeue_per_poll", 1) if r["case"] == "slurm" else "-"
    busy = r.get("worst_lag_cpu_s") or {}
    lag = " / ".join(
        f"{s(f'worst_lag_{k}_s')}" + (f" ({busy[k]:.2f})" if k in busy else "")
        for k in ("startup", "window", "end")
    )
    own = r.get("worst_own_lag_s") or {}
    own_lag = " / ".join(f"{own[k]:.3f}" if k in own else "-" for k in ("startup", "window", "end"))
    collections = f"{s('gc_worst_s')} / {r.get('gc_full_collections_window', '-')}"
    delay = f"{s('delay_median_s', 1)} / {s('delay_max_s', 1)}"
    recorded = f"{s('recorded_delay_median_s', 1)} / {s('recorded_delay_max_s', 1)}"
    return (
        f"| {name[r['case']]}{version} | {r['n']} | {logs} | {r.get('spread_s', 0):g} "
        f"| {r['cpu_cores']:.3f} | {r['peak_threads']} / {r.get('peak_threads_all', '-')} "
        f"| {r['rss_mb']:.0f} | {lag} | {own_lag} | {collections} | {s('lag_p99_window_s')} "
        f"| {s('slowest_round_window_s', 2)} / {s('slowest_round_end_s', 2)} | {squeue} "
        f"| {delay} | {recorded if r['case'] == 'local_cwd' else '-'} "
        f"| {r['events']}/{r['n']} | {r['load']:.1f} |"
    )


def write(results: List[Dict[str, Any]], path: Path) -> str:
    lines = [
        f"`benchmarks/bench_triggerer.py`, {time.strftime('%Y-%m-%d %H:%M')} UTC, "
        f"{os.cpu_count()} cores (load average in the last column, 1 min, at the case's end). "
        f"Poll interval {POLL:g} s; a {WINDOW:g} s steady window after every trigger started "
        "and had its first look. The triggerer process runs at "
        f"nice {NICE} (here the N apps and their supervisors share its cores; in a deployment "
        "they run elsewhere). Ends over: the apps end that many seconds apart, first to last "
        "(`DateTimeTrigger`s fire so); 0: in the same second. CPU: the triggerer process "
        "and its subprocesses (`squeue`, `sacct`), in the window. Threads: in the window / "
        "over the whole run. Lag: the loop's worst overshoot of a 0.1 s sleep while the N "
        "triggers start / in the window / while the apps end (in brackets: the CPU seconds "
        "the process used during it; far below the lag, it waited for a core); less GC: "
        "the same less the "
        "garbage collections' pauses inside each lag (they stop every thread; the heap is "
        "mostly Airflow's: a full collection of it took 0.13 s in a bare process). GC: the "
        "worst pause over the run / full (generation 2) collections in the window. "
        "Round: the slowest poll round "
        "(one list, then each due app's calls), in the window / while the apps end. Delay: "
        "from the app's last act (a `touch`, or the `scancel`) to its trigger's event, "
        "median / max; recorded: from when local_cwd's supervisor recorded the end.",
        "",
        "| triggers | N | apps' output | ends over (s) | CPU (cores) | threads "
        "| RSS (MB) | worst lag (s) | less GC (s) | GC worst (s) / full in window "
        "| lag p99 (s) | round (s) | squeue per 5 s | delay (s) | recorded (s) | events | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
    parser.add_argument(
        "--spread", type=float, default=SPREAD, help="seconds over which the apps end"
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS")
    parser.add_argument("--torchx-path", help="run the triggers of the torchx found here")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    cases = [(args.case, args.n, args.logs, args.spread)] if args.case else CASES
    results = []
    for case, n, logs, spread in cases:
        result = run_case(case, n, logs, args.window, spread, args.torchx_path)
        print(json.dumps(result), flush=True)
        results.append(result)
    if not args.no_write:
        print(write(results, ROOT / "benchmarks" / "RESULTS.md"))


if __name__ == "__main__":
    main()
