"""Run the reference DAG once, locally: embedded sqlite Airflow, local_cwd jobs, MLflow on sqlite.

    python examples/pipelines/airflow/run_local.py --out ./out

Prints each stage's status, the test accuracy, the MLflow run ids, and how to open
the MLflow UI.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path


def setup_env(out: Path) -> str:
    """Point Airflow, torchx and MLflow at ``out`` (before airflow is imported)."""
    mlflow_uri = f"sqlite:///{out / 'mlflow.db'}"
    os.environ.setdefault("AIRFLOW_HOME", str(out / "airflow"))
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(Path(__file__).resolve().parent))
    os.environ.setdefault("TORCHX_HOME", str(out / "torchx_home"))
    os.environ["TORCHX_TRACKERS"] = os.environ.get("TORCHX_TRACKERS", "mlflow")
    os.environ.setdefault("TORCHX_TRACKER_MLFLOW_CONFIG", mlflow_uri)
    return os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"]


def migrate_db() -> None:
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    subprocess.run(
        [airflow, "db", "migrate"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default="out", help="directory for Airflow, MLflow and the pipeline outputs"
    )
    parser.add_argument("--j", default="1:2x1", help="nodes x processes of the training stage")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--limit", type=int, default=0, help="rows of data to use (0: all)")
    parser.add_argument("--scheduler", default="local_cwd")
    parser.add_argument(
        "--verbose", action="store_true", help="show Airflow's task logs (with every job log line)"
    )
    parser.add_argument(
        "--openlineage",
        metavar="FILE",
        help="append the run's OpenLineage events (one JSON per line) to FILE",
    )
    args = parser.parse_args()
    if args.openlineage:
        transport = {"type": "file", "log_file_path": os.path.abspath(args.openlineage)}
        os.environ["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps({**transport, "append": True})
        os.environ.setdefault("AIRFLOW__OPENLINEAGE__NAMESPACE", "torchx-example")
    if not args.verbose:
        os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    mlflow_uri = setup_env(out)
    # this script's own choice: MLflow announces creating a new store at INFO
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)

    print(f"[1/3] preparing Airflow (sqlite under {os.environ['AIRFLOW_HOME']})", flush=True)
    migrate_db()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_dag import dag  # noqa: E402

    print("[2/3] running the DAG: datapreproc -> train (elastic DDP) -> evaluate", flush=True)
    start = time.monotonic()
    conf = {
        "base_dir": str(out / "pipeline"),
        "j": args.j,
        "epochs": args.epochs,
        "limit": args.limit,
        "scheduler": args.scheduler,
    }
    dag_run = dag.test(run_conf=conf)
    elapsed = time.monotonic() - start

    print(f"[3/3] DAG run {dag_run.run_id}: {dag_run.state} in {elapsed:.0f} s", flush=True)
    from torchx.runner import get_runner
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": mlflow_uri})[0]
    handles = {}
    for ti in dag_run.get_task_instances():
        print(f"  {ti.task_id:<12} {ti.state}")
    with get_runner() as runner:
        for app in runner.list(args.scheduler)[:3][::-1]:
            handles[app.name] = app.app_handle
            print(
                f"  {app.name:<12} {app.app_handle}"
                f"  mlflow run {tracker.mlflow_run_id(app.app_handle)}"
            )
    metrics_files = sorted((out / "pipeline").glob("*/eval/metrics.json"), key=os.path.getmtime)
    ok = str(dag_run.state) in ("success", "DagRunState.SUCCESS")
    if metrics_files and ok:
        accuracy = json.loads(metrics_files[-1].read_text())["test_accuracy"]
        print(f"test accuracy: {accuracy:.4f}")
    pipeline_id = tracker.mlflow_run_id(f"airflow://{dag.dag_id}/{dag_run.run_id}")
    print(f"MLflow pipeline run: {pipeline_id} (stage runs are nested under it)")
    if args.openlineage:
        print(f"OpenLineage events: {os.path.abspath(args.openlineage)}")
    print(
        f"open the MLflow UI:  {os.path.dirname(sys.executable)}/mlflow ui"
        f" --backend-store-uri {mlflow_uri}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
