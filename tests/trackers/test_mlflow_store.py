"""A new sqlite store made by torchx is what the installed MLflow creates, and MLflow opens
it as it is (real MLflow: its own store creation, MlflowClient, ``mlflow.search_runs``).

Each test states what holds on any MLflow a user can install: torchx's fast paths (a store
from the snapshot, rows by SQL, no ``import mlflow``) where the installed MLflow's schema is
the snapshot's or a checked one, and MLflow's own client where it is not (a newer release),
with the same records either way."""

from __future__ import annotations

import inspect
import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from torchx.trackers.api import AppRun
from torchx.trackers.mlflow_backend import MLflowTracker
from torchx.trackers.mlflow_sqlite import (
    SNAPSHOT,
    SqliteStore,
    checked_revisions,
    mlflow_head_revision,
)
from torchx.trackers.mlflow_store import ClientStore

# the installed MLflow's schema is the snapshot's: torchx creates a store without MLflow
FROM_SNAPSHOT = json.loads(Path(SNAPSHOT).read_text())["head"] == mlflow_head_revision()
# ... is a revision the tests checked: torchx writes and reads its rows by SQL
ROWS_BY_SQL = mlflow_head_revision() in checked_revisions()
STORE = SqliteStore if ROWS_BY_SQL else ClientStore

MAKE = textwrap.dedent("""
    import sys
    from torchx.trackers.mlflow_sqlite import create_store

    create_store(sys.argv[1], sys.argv[2] or None)
    print("mlflow" in sys.modules)
""")


def make_store(path: Path, cwd: Path, head: str = "") -> bool:
    """torchx creates the store ``path`` in a fresh process; True if it imported mlflow."""
    out = subprocess.run(
        [sys.executable, "-c", MAKE, str(path), head],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()[-1] == "True"


def mlflow_store(path: Path) -> None:
    """The installed MLflow creates a store, its own way."""
    from mlflow import MlflowClient

    MlflowClient(f"sqlite:///{path}").search_experiments()


CONSTRAINT = ("CONSTRAINT", "CHECK", "FOREIGN KEY", "UNIQUE", "PRIMARY KEY")


def _definitions(sql: str) -> Tuple[Tuple[str, ...], ...]:
    """Columns in order, table constraints in any: MLflow's own migrations write a table's
    constraints (and create its indexes) in an order that varies from one store to the next."""
    lines = [line.strip().rstrip(",").strip() for line in (sql or "").splitlines()]
    columns = tuple(line for line in lines if not line.startswith(CONSTRAINT))
    return columns, tuple(sorted(line for line in lines if line.startswith(CONSTRAINT)))


def schema(path: Path) -> List[Tuple[Any, ...]]:
    """``sqlite_master`` (but where its pages are, and the orders above)."""
    with sqlite3.connect(path) as db:
        master = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    return sorted((kind, name, table, _definitions(sql)) for kind, name, table, sql in master)


def rows(path: Path, *skip: str) -> Dict[str, List[Dict[str, Any]]]:
    """Every non-empty table's rows, but columns named in ``skip`` (times)."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        for (table,) in tables:
            found = [dict(r) for r in db.execute(f'SELECT * FROM "{table}"')]
            if found:
                out[table] = [{k: v for k, v in r.items() if k not in skip} for r in found]
    return out


TIMES = ("creation_time", "last_update_time")


def test_a_new_store_is_what_mlflow_creates_and_mlflow_opens_it_without_migrating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # MLflow's default experiment keeps artifacts in ./mlruns
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    theirs, ours = tmp_path / "theirs.db", tmp_path / "ours.db"
    assert make_store(ours, tmp_path) is not FROM_SNAPSHOT  # the snapshot needs no MLflow
    assert stat.S_IMODE(ours.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".mlflow-")] == []
    mlflow_store(theirs)
    assert schema(ours) == schema(theirs)
    assert rows(ours, *TIMES) == rows(theirs, *TIMES)

    # the job's experiment, as torchx writes it and as MLflow's create_experiment does
    import mlflow
    from mlflow import MlflowClient

    store = MLflowTracker(tracking_uri=f"sqlite:///{ours}").store
    assert isinstance(store, STORE)
    store.experiment_id("torchx", str(tmp_path / "artifacts"))
    client = MlflowClient(f"sqlite:///{theirs}")
    client.create_experiment("torchx", artifact_location=str(tmp_path / "artifacts" / "torchx"))
    assert rows(ours, *TIMES) == rows(theirs, *TIMES)

    # MLflow opens ours as it is: what `mlflow ui` asks first, then a run and its reads
    before = schema(ours)
    uri = f"sqlite:///{ours}"
    client = MlflowClient(uri)
    assert sorted(e.name for e in client.search_experiments()) == ["Default", "torchx"]
    exp = client.get_experiment_by_name("torchx")
    run = client.create_run(exp.experiment_id, run_name="r")
    client.log_metric(run.info.run_id, "m", 1.0)
    client.set_terminated(run.info.run_id)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}
    mlflow.set_tracking_uri(uri)
    try:
        found = mlflow.search_runs(experiment_ids=[exp.experiment_id])
    finally:
        mlflow.set_tracking_uri(None)
    assert list(found["run_id"]) == [run.info.run_id]
    assert schema(ours) == before  # nothing was migrated
    with sqlite3.connect(ours) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_another_mlflow_schema_head_falls_back_to_mlflow_itself(tmp_path: Path) -> None:
    """The snapshot is used only for its own head: for another one (an MLflow that is not
    the pinned one), MLflow creates the store, also in a temp file linked into place."""
    other = "0" * 12  # a head the snapshot is not for
    assert mlflow_head_revision() not in (None, other)
    assert make_store(tmp_path / "slow.db", tmp_path, head=other)  # MLflow made it
    assert make_store(tmp_path / "fast.db", tmp_path) is not FROM_SNAPSHOT
    assert schema(tmp_path / "slow.db") == schema(tmp_path / "fast.db")
    assert rows(tmp_path / "slow.db", *TIMES) == rows(tmp_path / "fast.db", *TIMES)
    assert stat.S_IMODE((tmp_path / "slow.db").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fast.db", "slow.db"]


def test_a_schema_revision_no_test_checked_goes_through_mlflows_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are written only on revisions listed in ``mlflow_schema_checked.txt``; on
    any other (a newer MLflow), MLflow's own client records the same run."""
    from mlflow import MlflowClient

    from torchx.trackers import mlflow_sqlite

    checked = tmp_path / "checked.txt"
    checked.write_text("0" * 12 + "  # a revision that is not the installed MLflow's\n")
    monkeypatch.setattr(mlflow_sqlite, "CHECKED", str(checked))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker(tracking_uri=uri)
    assert isinstance(tracker.store, ClientStore)
    tracker.add_metadata("job-1", stage="s")
    tracker.log_metrics("job-1", {"loss": 0.5}, step=2)
    tracker.end_run("job-1", "FINISHED")
    run = MlflowClient(uri).get_run(str(tracker.mlflow_run_id("job-1")))
    assert run.data.tags["stage"] == "s" and run.data.metrics == {"loss": 0.5}
    assert run.info.status == "FINISHED"
    monkeypatch.undo()  # the installed MLflow's revision, if listed: rows by SQL again
    assert isinstance(MLflowTracker(tracking_uri=uri).store, STORE)


def test_the_pinned_mlflows_schema_revision_is_checked() -> None:
    """A newer MLflow's revision is not listed until these tests pass with it (then add it
    to torchx/trackers/mlflow_schema_checked.txt); until then its stores go by MLflow."""
    from importlib.metadata import version

    from torchx.trackers.mlflow_sqlite import checked_revisions

    pins = (Path(__file__).parents[2] / "constraints.txt").read_text().splitlines()
    if f"mlflow=={version('mlflow')}" not in pins:
        pytest.skip(f"mlflow {version('mlflow')} is not the pinned one")
    assert mlflow_head_revision() in checked_revisions()


def test_a_store_made_meanwhile_by_mlflow_itself_is_kept(tmp_path: Path) -> None:
    """``create_store`` never replaces a store another process (``mlflow ui``) made."""
    path = tmp_path / "mlflow.db"
    mlflow_store(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE experiments SET name = 'kept' WHERE experiment_id = 0")
    assert make_store(path, tmp_path) is not FROM_SNAPSHOT
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM experiments").fetchall() == [("kept",)]
    assert [p for p in os.listdir(tmp_path) if "mlflow" in p] == ["mlflow.db"]  # no temp file


RANK = """
import sys
from torchx.tracker import app_run_from_env

run = app_run_from_env()
run.add_metadata(stage="train")
for step, loss in ((1, 2.0), (3, 0.5), (2, 1.0), (4, float("nan")), (5, float("inf"))):
    run.log_metrics({"loss": loss, "acc": step / 10}, step=step)
lineage(run, sys.argv[2])
open(sys.argv[1], "w").write(str("mlflow" in sys.modules))
"""


def lineage(run: AppRun, data: str) -> None:
    """What record_output / record_input do: artifacts (a directory and a file), a
    dataset output, and inputs (the second time: nothing new)."""
    run.add_artifact("dataset", data, {"type": "dataset", "digest": "d1"})
    run.add_artifact("model", data + "/sub/w.bin", {"type": "model"})
    run.add_source("local_cwd://torchx/prep-1", "dataset")
    run.add_source("local_cwd://torchx/prep-1", "dataset")
    run.add_source("local_cwd://torchx/eval-1", None)


LINEAGE = "from torchx.trackers.api import AppRun\n" + inspect.getsource(lineage)


def test_a_ranks_tracker_calls_on_sqlite_write_what_mlflow_writes_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from torchx import specs
    from torchx.runner import get_runner

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", uri)
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    out, data = tmp_path / "imported", tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "x.csv").write_text("1,2\n")
    (data / "sub" / "w.bin").write_bytes(b"w" * 100)
    rank = ["-c", LINEAGE + RANK, str(out), str(data)]
    role = specs.Role("w", ".", entrypoint=sys.executable, args=rank)
    with get_runner() as runner:
        handle = runner.run(specs.AppDef("rank", [role]), "local_cwd")
        assert runner.wait(handle, wait_interval=1, timeout=240).state == specs.AppState.SUCCEEDED
    assert out.read_text() == str(not ROWS_BY_SQL)  # by SQL, the rank never imports mlflow

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("torchx").experiment_id
    ours = client.search_runs([exp], f"tags.`torchx.job_id` = '{handle}'")[0].info.run_id
    theirs = client.create_run(exp).info.run_id  # the same calls, by MLflow itself
    for step, loss in ((1, 2.0), (3, 0.5), (2, 1.0), (4, float("nan")), (5, float("inf"))):
        for key, value in (("loss", loss), ("acc", step / 10)):
            client.log_metric(theirs, key, value, step=step)

    def metrics(run_id: str) -> Tuple[Any, ...]:
        history = [
            (key, m.step, str(m.value))
            for key in ("loss", "acc")
            for m in client.get_metric_history(run_id, key)
        ]
        latest = client.get_run(run_id).data.metrics  # (the job's run also has its hours)
        return sorted(history), {k: str(latest[k]) for k in ("loss", "acc") if k in latest}

    assert metrics(ours) == metrics(theirs)
    assert metrics(ours)[1] == {"loss": str(1.7976931348623157e308), "acc": "0.5"}
    assert client.get_run(ours).data.tags["stage"] == "train"

    # the same lineage calls by MlflowClient (a tracker whose store is MLflow's client)
    by_client = MLflowTracker(tracking_uri=uri)
    by_client._store = ClientStore(lambda: by_client.client)
    lineage(AppRun("local_cwd://torchx/by-client", [by_client]), str(data))
    theirs = by_client.mlflow_run_id("local_cwd://torchx/by-client")

    def recorded(run_id: str) -> Tuple[Any, ...]:
        run = client.get_run(run_id)
        tags = {
            k: v
            for k, v in run.data.tags.items()
            if k.startswith(("torchx.artifact.", "torchx.source"))
        }
        inputs = sorted(
            (i.dataset.name, i.dataset.digest, i.dataset.source_type, i.dataset.source)
            + tuple((t.key, t.value) for t in i.tags)
            for i in run.inputs.dataset_inputs
        )
        files = [
            (f.path, f.is_dir, f.file_size)
            for d in ("dataset", "dataset/sub", "model")
            for f in client.list_artifacts(run_id, d)
        ]
        return tags, inputs, sorted(files)

    assert recorded(ours) == recorded(theirs)
    tags, inputs, files = recorded(ours)
    assert len(inputs) == 3 and ("dataset/sub/w.bin", False, 100) in files, (inputs, files)
    assert tags["torchx.artifact.dataset.digest"] == "d1"


PREP = "local_cwd://torchx/prep-1"
PIPELINE = textwrap.dedent("""
    import json, sys
    from torchx.pipelines.core import close_pipeline_run, open_pipeline_run
    from torchx.trackers.api import build_trackers

    store, pipeline = {"mlflow": sys.argv[1]}, "airflow://dag/run-1"
    open_pipeline_run(pipeline, store, orchestrator="airflow")
    tracker = build_trackers(store)[0]
    for stage, hours in (("prep", 0.25), ("train", 1.5), ("eval", None)):
        tracker.set_parent(f"local_cwd://torchx/{stage}-1", pipeline)
        if hours is not None:
            tracker.log_metrics(f"local_cwd://torchx/{stage}-1", {"cpu_hours": hours})
    tracker.add_source("local_cwd://torchx/train-1", "local_cwd://torchx/prep-1", "dataset")
    tracker.add_source("local_cwd://torchx/eval-1", "local_cwd://torchx/prep-1", "dataset")
    tracker.add_source("local_cwd://torchx/eval-1", "local_cwd://torchx/train-1", "model")
    hours = close_pipeline_run(pipeline, store, "FINISHED")
    from torchx.runner.resource_hours import recorded_hours  # a stage's, as Airflow reads it

    train = recorded_hours(tracker, tracker.mlflow_run_id("local_cwd://torchx/train-1"))
    print(json.dumps([hours.cpu_hours, train, "mlflow" in sys.modules]))
""")


def test_a_pipelines_stage_reads_on_sqlite_are_mlflows_and_import_no_mlflow(
    tmp_path: Path,
) -> None:
    """Closing a pipeline run sums its stages' hours (and Airflow reads each stage's): on
    sqlite its stage runs, lineage and metrics are read by SQL, no ``import mlflow`` (2.2 s
    of CPU per pipeline), and those reads equal MlflowClient's (search_runs, metrics)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = subprocess.run(
        [sys.executable, "-c", PIPELINE, uri], capture_output=True, text=True, check=True
    ).stdout
    reads = json.loads(out.strip().splitlines()[-1])  # (a new store: from the snapshot)
    assert reads == [1.75, {"cpu_hours": 1.5}, not (ROWS_BY_SQL and FROM_SNAPSHOT)], out
    by_sql, by_client = MLflowTracker(tracking_uri=uri), MLflowTracker(tracking_uri=uri)
    by_client._store = ClientStore(lambda: by_client.client)
    for reads in (
        lambda t: list(t.run_ids(parent_run_id="airflow://dag/run-1")),
        lambda t: list(t.run_ids()),
        lambda t: sorted((s.source_run_id, s.artifact_name) for s in t.descendants(PREP)),
        lambda t: t.store.latest_metrics(t.mlflow_run_id("airflow://dag/run-1")),
    ):
        assert reads(by_sql) == reads(by_client)
    assert list(by_sql.run_ids(parent_run_id="airflow://dag/run-1")) == [
        f"local_cwd://torchx/{stage}-1" for stage in ("prep", "train", "eval")
    ]
    assert sorted(s.source_run_id for s in by_sql.descendants(PREP)) == [
        "local_cwd://torchx/eval-1",
        "local_cwd://torchx/train-1",
    ]
