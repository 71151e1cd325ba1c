"""The reference pipeline's cost: its three programs by hand, then under each orchestrator.

    .venv/bin/python benchmarks/bench_pipeline.py --repeat 3

Cases, interleaved round by round (the machine is shared: the same load hits each alike):

- ``bare``: the three stage programs back to back, the exact commands local_cwd runs
  (taken from the components' dry run): ``python datapreproc.py``, the two torchrun
  agents of ``-j 1:2x1`` (started together, as local_cwd starts them), ``python
  evaluate.py``. No tracking (outside a torchx job the stages record nothing).
- ``airflow``: ``examples/pipelines/airflow/reference_dag.py`` through ``dag.test()``.
- ``prefect``: ``examples/pipelines/prefect/reference_flow.py`` called in-process; with
  no ``PREFECT_API_URL`` Prefect starts its own temporary (ephemeral) server.
- ``kfp``: ``examples/pipelines/kfp/reference_pipeline.py`` through ``kfp.local`` and
  ``SubprocessRunner(use_venv=False)``.

Each orchestrated case runs twice per round: ``+mlflow`` with MLflow tracking on sqlite as
the quick start does, and ``untracked`` (no ``TORCHX_TRACKERS``), so the ratio to the bare
programs compares like with like and the difference is what tracking costs. ``prefect
server`` is ``prefect untracked`` against a Prefect server started once before the rounds
(``prefect server start``, as a deployment has one), so the ephemeral server's start is
not counted.

The ``floor`` cases are the orchestrator without torchx: the bare commands, one plain task
per stage (``airflow floor``: a DAG of three ``@task``s through ``dag.test()``; ``prefect
floor``: a flow of three ``@task``s on the ephemeral server; ``prefect server-floor``: the
same flow against the running server). What an orchestrated case costs above its floor is
torchx's part; what the floor costs above the bare programs is the orchestrator's own.

Each orchestrated case is a fresh ``python`` process, timed from the outside (what a user
pays: interpreter, imports, the orchestrator's start, the pipeline); inside it, the time
of the pipeline call alone (``dag.test()``, the flow call, the pipeline call) is reported
too. One-time set-up is left out of both: ``airflow db migrate`` and the MLflow
database's creation are done once, and each run starts from a copy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ORCHESTRATORS = ("airflow", "prefect", "kfp")


# --- the child: one orchestrated pipeline run in a fresh process ---------------------


def child_env(out: Path, tracked: bool, prefect_api: Optional[str] = None) -> Dict[str, str]:
    """The env of one orchestrated run: its own torchx home, Airflow home, Prefect home
    (and Prefect's API, when a server runs)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHX_", "AIRFLOW", "PREFECT_", "MLFLOW_"))
    }
    env.update(
        TORCHX_HOME=str(out / "torchx_home"),
        AIRFLOW_HOME=str(out / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(EXAMPLES / "pipelines" / "airflow"),
        AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING",
        PREFECT_HOME=str(out / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_MEMO_STORE_PATH=str(out / "prefect" / "memo_store.toml"),
        # Prefect's default (20 s) is too short on this busy machine; it is counted anyway
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",
        PYTHONPATH=str(ROOT),
    )
    if prefect_api:
        env["PREFECT_API_URL"] = prefect_api
    if tracked:
        env.update(
            TORCHX_TRACKERS="mlflow", TORCHX_TRACKER_MLFLOW_CONFIG=f"sqlite:///{out / 'mlflow.db'}"
        )
    return env


def run_child(orchestrator: str, out: Path, epochs: int, limit: int, j: str) -> Dict[str, Any]:
    """Run the pipeline once under ``orchestrator``; the phases' times, in seconds."""
    started = time.monotonic()
    base_dir = out / "pipeline"
    if orchestrator.endswith("-floor"):
        pipeline = floor_pipeline(orchestrator.split("-")[0], out)
        imported = time.monotonic()
        ok = pipeline()
        return {"ok": ok, "import": imported - started, "pipeline": time.monotonic() - imported}
    if orchestrator == "airflow":
        sys.path.insert(0, str(EXAMPLES / "pipelines" / "airflow"))
        from reference_dag import dag

        imported = time.monotonic()
        conf = {"base_dir": str(base_dir), "j": j, "epochs": epochs, "limit": limit}
        dag_run = dag.test(run_conf=conf)
        ok = str(dag_run.state) in ("success", "DagRunState.SUCCESS")
    elif orchestrator == "prefect":
        sys.path.insert(0, str(EXAMPLES / "pipelines" / "prefect"))
        from reference_flow import reference_flow

        imported = time.monotonic()
        result = reference_flow(base_dir=str(base_dir), j=j, epochs=epochs, limit=limit)
        ok = result.get("test_accuracy") is not None
    else:
        import kfp.local

        sys.path.insert(0, str(EXAMPLES / "pipelines" / "kfp"))
        from reference_pipeline import reference_pipeline

        imported = time.monotonic()
        runner = kfp.local.SubprocessRunner(use_venv=False)
        kfp.local.init(runner=runner, pipeline_root=str(out / "kfp_root"))
        reference_pipeline(base_dir=str(base_dir), j=j, epochs=str(epochs), limit=str(limit))
        ok = True
    ended = time.monotonic()
    ok = ok and any(base_dir.glob("**/eval/metrics.json"))  # Airflow's is under its run id
    return {"ok": ok, "import": imported - started, "pipeline": ended - imported}


def stage_env() -> Dict[str, str]:
    """The env the bare programs and the floors' plain tasks run them with: this process's,
    without torchx's, MLflow's and the orchestrators' settings (outside a torchx job the
    stages record nothing), so a floor's stages run as the bare ones do."""
    drop = ("TORCHX_", "MLFLOW_", "AIRFLOW", "PREFECT_", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def floor_stage(out: str, index: int) -> None:
    """Stage ``index`` of ``{out}/stages.json``, as a plain task of the floor runs; its start
    and end go to ``floor-apps.jsonl``."""
    stages = json.loads(Path(out, "stages.json").read_text())
    with open(Path(out, "floor.log"), "ab") as log:
        ok, start, end = run_stage(stages[index], stage_env(), log, time.monotonic() + 1800)
    with open(Path(out, "floor-apps.jsonl"), "a") as f:
        f.write(json.dumps([start, start, end]) + "\n")
    if not ok:
        raise RuntimeError(f"stage {index} failed: see {out}/floor.log")


def floor_pipeline(orchestrator: str, out: Path) -> Callable[[], bool]:
    """The bare commands, one plain task per stage (``floor_stage``), under ``orchestrator``
    without torchx: imported, not yet run."""
    if orchestrator == "airflow":
        os.environ["BENCH_FLOOR_OUT"] = str(out)
        folder = Path(__file__).resolve().parent / "airflow_floor"
        os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(folder)
        sys.path.insert(0, str(folder))
        from floor_dag import dag

        def run() -> bool:
            ok = str(dag.test().state) in ("success", "DagRunState.SUCCESS")
            return ok and (out / "eval" / "metrics.json").exists()

        return run

    from prefect import flow, task

    stage = task(name="stage")(floor_stage)

    @flow(name="torchx-bench-floor")
    def floor_flow(run_dir: str) -> None:
        for index in range(3):  # datapreproc, train, evaluate
            stage(run_dir, index)

    def run() -> bool:
        floor_flow(str(out))
        return (out / "eval" / "metrics.json").exists()

    return run


# --- the parent: set-up, the bare programs, timing ------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bare_commands(
    out: Path, epochs: int, limit: int, j: str
) -> List[List[Tuple[List[str], Dict[str, str], Optional[str]]]]:
    """The stages' commands as local_cwd runs them (from the components' dry run), each
    stage a list of (argv, env) started together; torchx's own env entries left out."""
    sys.path.insert(0, str(ROOT))
    from examples import components
    from torchx.runner import get_runner

    data, model = str(out / "data"), str(out / "model")
    apps = [
        components.datapreproc(output_path=data, limit=limit or None),
        components.trainer(
            data_path=data,
            output_path=model,
            checkpoint_path=str(out / "checkpoints"),
            j=j,
            epochs=epochs,
            rdzv_port=free_port(),
        ),
        components.evaluate(model_path=model, data_path=data, output_path=str(out / "eval")),
    ]
    stages = []
    with get_runner() as runner:
        for app in apps:
            request = runner.dryrun(app, "local_cwd").request
            stage = []
            for i, replica in enumerate(request.role_params[app.roles[0].name]):
                env = {k: v for k, v in replica.env.items() if not k.startswith("TORCHX_")}
                env["PET_LOG_DIR"] = str(out / "torchelastic")
                env["TORCHELASTIC_ERROR_FILE"] = str(out / f"error-{i}.json")
                env["TORCHX_RANK0_HOST"] = "localhost"  # the rendezvous host (local_cwd's macro)
                stage.append((list(replica.args), env, replica.cwd))
            stages.append(stage)
    return stages


def run_stage(
    stage: List[Any], base: Dict[str, str], log: Any, deadline: float
) -> Tuple[bool, float, float]:
    """Start a stage's commands together (as local_cwd starts its replicas) and wait for
    them; whether all exited 0, and the stage's start and end (wall clock)."""
    start = time.time()
    procs = [
        subprocess.Popen(
            argv,
            env={**base, **env},
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own, to stop it whole
        )
        for argv, env, cwd in stage
    ]
    try:
        codes = [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    finally:  # on a timeout or an interrupt: nothing it started outlives the run
        for p in procs:
            stop_group(p)
    return all(code == 0 for code in codes), start, time.time()


def run_bare(out: Path, epochs: int, limit: int, j: str, timeout: float) -> Dict[str, Any]:
    stages = bare_commands(out, epochs, limit, j)
    base = stage_env()
    started = time.monotonic()
    ok = True
    with open(out / "bare.log", "wb") as log:
        for stage in stages:
            ok = run_stage(stage, base, log, started + timeout)[0] and ok
    wall = time.monotonic() - started
    return {"ok": ok and (out / "eval" / "metrics.json").exists(), "wall": wall}


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc``'s process group (it was started in a session of its own) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has ended
        pass
    proc.wait()


def cancel_leftovers(torchx_home: Path) -> None:
    """Cancel the apps a run left running in its ``TORCHX_HOME`` (a timed-out or killed
    run): its orchestrator's process group is gone, local_cwd's supervisors are not."""
    cancel = (
        "from torchx.runner import get_runner\n"
        "from torchx.specs.states import is_terminal\n"
        "with get_runner() as runner:\n"
        "    for app in runner.list('local_cwd'):\n"
        "        if not is_terminal(app.state):\n"
        "            runner.cancel(app.app_handle)\n"
    )
    env = dict(os.environ, TORCHX_HOME=str(torchx_home))
    subprocess.run([sys.executable, "-c", cancel], env=env, check=False, timeout=300)


def prepare_templates(work: Path) -> Dict[str, Path]:
    """One migrated Airflow database and one empty MLflow database, copied into each run."""
    airflow_db = work / "template-airflow.db"
    env = child_env(work / "template", tracked=False)
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{airflow_db}"
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    mlflow_db = work / "template-mlflow.db"
    make_mlflow = (
        "import mlflow, sys; mlflow.set_tracking_uri(sys.argv[1]); mlflow.search_experiments()"
    )
    subprocess.run(
        [sys.executable, "-c", make_mlflow, f"sqlite:///{mlflow_db}"], check=True, env=env
    )
    return {"airflow": airflow_db, "mlflow": mlflow_db}


def recorded_apps(out: Path) -> List[Tuple[float, float, float]]:
    """Each stage's (submitted, started, ended): from local_cwd's own records of its apps
    (``request.json``: submitted; ``state.json``: started, and ended when terminal), or
    the floor's ``floor-apps.jsonl``."""
    if (out / "floor-apps.jsonl").exists():
        lines = (out / "floor-apps.jsonl").read_text().splitlines()
        return [tuple(json.loads(line)) for line in lines]  # type: ignore[misc]
    apps = []
    for request in (out / "torchx_home").glob("local_cwd/*/*/request.json"):
        state = json.loads((request.parent / "state.json").read_text())
        submitted = json.loads(request.read_text())["submitted"]
        apps.append((submitted, state["started"], state["updated"]))
    return apps


def app_phases(
    apps: List[Tuple[float, float, float]], spawned: float, exited: float
) -> Dict[str, float]:
    """Where an orchestrated run's wall time went, from its stages' records."""
    if len(apps) != 3:
        return {}
    apps.sort()
    between = sum(apps[i + 1][0] - apps[i][2] for i in range(len(apps) - 1))
    return {
        "before first submit": apps[0][0] - spawned,
        "submit to start": sum(start - submitted for submitted, start, _ in apps),
        "stage programs": sum(end - start for _, start, end in apps),
        "end to next submit": between,
        "after last end": exited - apps[-1][2],
    }


def run_orchestrated(
    orchestrator: str,
    tracked: bool,
    out: Path,
    templates: Dict[str, Path],
    args: argparse.Namespace,
    prefect_api: Optional[str] = None,
) -> Dict[str, Any]:
    (out / "airflow").mkdir(parents=True)
    shutil.copyfile(templates["airflow"], out / "airflow" / "airflow.db")
    if tracked:
        shutil.copyfile(templates["mlflow"], out / "mlflow.db")
    command = [sys.executable, __file__, "--child", orchestrator, "--out", str(out)]
    command += ["--epochs", str(args.epochs), "--limit", str(args.limit), "--j", args.j]
    spawned, started = time.time(), time.monotonic()
    with open(out / "child.log", "wb") as log, open(out / "child.out", "wb") as stdout:
        proc = subprocess.Popen(
            command,
            env=child_env(out, tracked, prefect_api),
            stdout=stdout,
            stderr=log,
            start_new_session=True,
        )
        code: Optional[int] = None
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            pass  # a failed run; stopped below
        finally:  # on a timeout or an interrupt: nothing it started outlives the run
            stop_group(proc)
            if code != 0:
                cancel_leftovers(out / "torchx_home")
    wall = time.monotonic() - started
    lines = (out / "child.out").read_text().strip().splitlines()
    result = json.loads(lines[-1]) if code == 0 and lines else {"ok": False}
    result.update(wall=wall, phases=app_phases(recorded_apps(out), spawned, spawned + wall))
    result["ok"] = bool(result["ok"]) and len(result["phases"]) > 0
    return result


@contextlib.contextmanager
def prefect_server(work: Path) -> Iterator[str]:
    """A Prefect server for the rounds (its API URL), stopped with its process group."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = child_env(work / "prefect-server", tracked=False)
    (work / "prefect-server" / "prefect").mkdir(parents=True)
    env["PREFECT_UI_ENABLED"] = "false"
    prefect = os.path.join(os.path.dirname(sys.executable), "prefect")
    command = [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    log_path = work / "prefect-server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{api}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"prefect server did not start: see {log_path}") from None
                time.sleep(0.5)
        yield api
    finally:
        stop_group(proc)


def loadavg() -> float:
    return os.getloadavg()[0]


# from the app records of each run (``app_phases``); "import" is the orchestrator's and the
# pipeline module's imports, "start + exit" the interpreter's start and its exit (wall minus
# the imports and the pipeline call)
PHASES = (
    "before first submit",
    "submit to start",
    "stage programs",
    "end to next submit",
    "after last end",
)


def summarize(results: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    """The tables: wall times and ratios, then where each orchestrated run's time went."""

    def median(case: str, get: Callable[[Dict[str, Any]], float]) -> float:
        values = [get(r) for r in results[case] if r["ok"]]
        return statistics.median(values) if values else float("nan")

    def ok(case: str) -> str:
        return f"{sum(r['ok'] for r in results[case])}/{len(results[case])}"

    orchestrated = [c for c in results if c != "bare" and any(r["ok"] for r in results[c])]
    bare = median("bare", lambda r: r["wall"]) if "bare" in results else float("nan")
    rows = [
        "| case | runs ok | wall (s) | wall / bare | overhead (s) | (bare + overhead) / bare |",
        "|---|---|---|---|---|---|",
    ]
    if "bare" in results:
        rows.append(f"| bare programs, untracked | {ok('bare')} | {bare:.1f} | 1.00x | | |")
    for case in orchestrated:
        wall = median(case, lambda r: r["wall"])
        extra = median(case, lambda r: r["wall"] - r["phases"]["stage programs"])
        rows.append(
            f"| {case} | {ok(case)} | {wall:.1f} | {wall / bare:.2f}x | {extra:.1f}"
            f" | {(bare + extra) / bare:.2f}x |"
        )
    rows += ["", "| case | import | start + exit | " + " | ".join(PHASES) + " (s) |"]
    rows.append("|---" * (len(PHASES) + 3) + "|")
    for case in orchestrated:
        cells = [f"{median(case, lambda r: r['import']):.1f}"]
        cells += [f"{median(case, lambda r: r['wall'] - r['import'] - r['pipeline']):.1f}"]
        cells += [f"{median(case, lambda r, p=p: r['phases'][p]):.1f}" for p in PHASES]
        rows.append(f"| {case} | " + " | ".join(cells) + " |")
    tracking = []
    for orchestrator in ORCHESTRATORS:
        on, off = f"{orchestrator} +mlflow", f"{orchestrator} untracked"
        if on in orchestrated and off in orchestrated:
            walls = median(on, lambda r: r["wall"]) - median(off, lambda r: r["wall"])
            extra = median(on, lambda r: r["wall"] - r["phases"]["stage programs"]) - median(
                off, lambda r: r["wall"] - r["phases"]["stage programs"]
            )
            tracking.append(f"{orchestrator} {walls:+.1f} s of wall, {extra:+.1f} s of overhead")
    if tracking:
        rows += ["", "Tracking's share (+mlflow minus untracked, medians): " + "; ".join(tracking)]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each runs every case)")
    parser.add_argument("--epochs", type=int, default=20, help="the reference pipeline's default")
    parser.add_argument("--limit", type=int, default=0, help="rows of data (0: all)")
    parser.add_argument("--j", default="1:2x1", help="the training stage's -j")
    parser.add_argument(
        "--cases",
        default="bare,"
        + ",".join(f"{o} +mlflow,{o} untracked" for o in ORCHESTRATORS)
        + ",prefect server,airflow floor,prefect floor,prefect server-floor",
        help="comma-separated cases to run",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds before a run is stopped (failed)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the runs' directories")
    parser.add_argument(
        "--results", help="append each run's result to this file (JSON lines) as it ends"
    )
    parser.add_argument(
        "--summarize", metavar="FILE", help="only print the tables of a --results file"
    )
    children = [*ORCHESTRATORS, "airflow-floor", "prefect-floor"]
    parser.add_argument("--child", choices=children, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        phases = run_child(args.child, Path(args.out), args.epochs, args.limit, args.j)
        print(json.dumps(phases), flush=True)
        return 0

    if args.summarize:
        runs = [json.loads(line) for line in Path(args.summarize).read_text().splitlines()]
        by_case: Dict[str, List[Dict[str, Any]]] = {}
        for run in runs:
            by_case.setdefault(run["case"], []).append(run)
        loads = [run["load"] for run in runs]
        print(f"{len(runs)} runs; 1-min load average {min(loads):.1f}-{max(loads):.1f}")
        print("\n".join(summarize(by_case)))
        return 0

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    work = Path(tempfile.mkdtemp(prefix="torchx-bench-pipeline-"))
    results: Dict[str, List[Dict[str, Any]]] = {c: [] for c in cases}
    loads = [loadavg()]
    stack = contextlib.ExitStack()
    try:
        templates = prepare_templates(work)
        server = (
            prefect_server(work)
            if {"prefect server", "prefect server-floor"} & set(cases)
            else contextlib.nullcontext()
        )
        prefect_api = stack.enter_context(server)
        for round_ in range(args.repeat):
            for case in cases:
                out = work / f"{case.replace(' ', '_').replace('+', '')}-{round_}"
                out.mkdir(parents=True)
                if case == "bare":
                    try:
                        result = run_bare(out, args.epochs, args.limit, args.j, args.timeout)
                    except subprocess.TimeoutExpired:
                        result = {"ok": False, "wall": args.timeout}
                else:
                    orchestrator, mode = case.split(" ")
                    tracked = mode == "+mlflow"
                    api = prefect_api if mode.startswith("server") else None
                    if mode.endswith("floor"):
                        stages = bare_commands(out, args.epochs, args.limit, args.j)
                        (out / "stages.json").write_text(json.dumps(stages))
                        orchestrator += "-floor"
                    result = run_orchestrated(orchestrator, tracked, out, templates, args, api)
                loads.append(loadavg())
                result["load"] = loads[-1]
                results[case].append(result)
                if args.results:
                    with open(args.results, "a") as f:
                        f.write(json.dumps({"case": case, "round": round_, **result}) + "\n")
                print(f"round {round_ + 1} {case}: {json.dumps(result)}", flush=True)
    finally:
        stack.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"runs kept in {work}")
    print()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {os.cpu_count()} cores,"
        f" Python {sys.version.split()[0]}, epochs={args.epochs} limit={args.limit or 'all'}"
        f" -j {args.j}, {args.repeat} rounds; 1-min load average"
        f" {min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})"
    )
    print()
    print("\n".join(summarize(results)))
    return 0 if all(r["ok"] for rs in results.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
