"""Tracking and lineage of TorchXOperator in Airflow's own terms, against a real ``mlflow
server`` on loopback: OpenLineage events through the real client's file transport, Asset
events, http extra links, and one FINISHED MLflow run per stage under the DAG run's run.

The reference DAG (datapreproc -> elastic DDP train -> evaluate) runs once for the module;
several tests read that one run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.mlflow_server import mlflow_server
from tests.pipelines.airflow.test_operator import _xcom

ROOT = Path(__file__).resolve().parents[3]
DAG_ID = "torchx_reference_pipeline"
STAGES = ("datapreproc", "train", "evaluate")
DEADLINE = 120.0
# where conftest.py points the OpenLineage client's file transport
OPENLINEAGE_EVENTS = Path(
    json.loads(os.environ["AIRFLOW__OPENLINEAGE__TRANSPORT"])["log_file_path"]
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as url:
        yield url


def _load_dag(name: str, source: Path) -> Any:
    """Put a DAG file into the dags folder (dag.test needs it there) and load it."""
    path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{name}.py"
    if not path.exists():
        path.symlink_to(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.dag


def _tracker(url: str) -> Any:
    from torchx.trackers.api import build_trackers

    return build_trackers({"mlflow": url})[0]


def _states(dag_run: Any) -> Dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


@pytest.fixture(scope="module")
def reference(
    server: str, tmp_path_factory: pytest.TempPathFactory, airflow_db: Path
) -> Iterator[Dict[str, Any]]:
    """One run of the reference DAG, every stage tracked on the real mlflow server."""
    work = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHX_HOME", str(work / "home"))
        mp.setenv("TORCHX_TRACKERS", "mlflow")
        mp.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", server)
        mp.chdir(work)
        dag = _load_dag("reference_dag", ROOT / "examples/pipelines/airflow/reference_dag.py")
        conf = {"base_dir": str(work / "out"), "j": "1:2x1", "epochs": 4, "limit": 600}
        dag_run = dag.test(run_conf=conf)
        from torchx.runner import get_runner

        with get_runner() as runner:
            handles = {a.name: a.app_handle for a in runner.list("local_cwd")}
        run_dir = work / "out" / dag_run.run_id.replace(":", "_").replace("+", "_")
        yield {"dag_run": dag_run, "handles": handles, "run_dir": run_dir, "url": server}


# the listener modules each Airflow listener manager registered: the task SDK's (task
# processes, dag.test()) and the core one (scheduler, api-server)
LISTENERS = """
import inspect
from airflow.listeners.listener import get_listener_manager as core
from airflow.sdk.listener import get_listener_manager as task_sdk

for lm in (task_sdk(), core()):
    print(sorted(p.__name__ if inspect.ismodule(p) else type(p).__module__
                 for p in lm.pm.get_plugins()))
"""


def test_torchx_listener_and_openlineage_load_through_the_entry_points(airflow_db: Path) -> None:
    """torchx's listener comes through the provider's ``airflow.plugins`` entry point, in
    every process, and OpenLineage's listener loads beside it. Run in a new interpreter
    started in the source tree, as ``python -m pytest`` (and so ``dag.test()``) runs: a
    second copy of torchx's metadata there (``torchx.egg-info``) made the task SDK stop
    loading entry-point plugins at the duplicate name, and OpenLineage's went missing."""
    out = subprocess.run(
        [sys.executable, "-c", LISTENERS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    task_sdk, core = out.stdout.strip().splitlines()[-2:]
    for registered in (task_sdk, core):
        assert "'torchx.pipelines.airflow.listener'" in registered, (registered, out.stderr)
        assert "'airflow.providers.openlineage.plugins.listener'" in registered, registered


def test_reference_dag_stages_nest_under_a_finished_pipeline_run(
    reference: Dict[str, Any],
) -> None:
    dag_run, handles = reference["dag_run"], reference["handles"]
    assert _states(dag_run) == {t: "success" for t in (*STAGES, "report")}, _states(dag_run)
    assert set(handles) == set(STAGES)  # one job per stage
    tracker = _tracker(reference["url"])
    pipeline = f"airflow://{DAG_ID}/{dag_run.run_id}"
    assert sorted(tracker.run_ids(parent_run_id=pipeline)) == sorted(handles.values())
    edges = {(e.source, e.target, e.artifact) for e in tracker.lineage(handles["evaluate"]).edges}
    assert (handles["train"], handles["evaluate"], "model") in edges
    assert (handles["datapreproc"], handles["train"], "dataset") in edges
    parent = tracker.mlflow_run_id(pipeline)
    assert tracker.client.get_run(parent).info.status == "FINISHED"  # the DAG's callback
    cpu_hours = 0.0
    for h in handles.values():
        data = tracker.client.get_run(tracker.mlflow_run_id(h)).data
        assert data.tags["mlflow.parentRunId"] == parent
        assert data.metrics["cpu_hours"] > 0 and data.metrics["gpu_hours"] == 0
        cpu_hours += data.metrics["cpu_hours"]
    # the DAG's callback summed its stages' resource-hours onto the pipeline run
    assert tracker.client.get_run(parent).data.metrics["cpu_hours"] == pytest.approx(cpu_hours)


def _openlineage_events(handles: Dict[str, str]) -> Dict[str, Dict[str, Any]]:
    """``{"<task> <eventType>": event}`` for this DAG run's tasks, read from the file the
    OpenLineage client's file transport appends to; polled until all six are there."""
    wanted = {f"{t} {kind}" for t in STAGES for kind in ("START", "COMPLETE")}
    found: Dict[str, Dict[str, Any]] = {}
    deadline = time.monotonic() + DEADLINE
    while True:
        events = []
        if OPENLINEAGE_EVENTS.exists():
            events = [json.loads(line) for line in OPENLINEAGE_EVENTS.read_text().splitlines()]
        complete = {
            e["run"]["runId"]: e
            for e in events
            if e["eventType"] == "COMPLETE"
            and e["run"]["facets"].get("torchx", {}).get("appHandle") in handles.values()
        }
        for e in events:
            if e["run"]["runId"] in complete:
                found[f"{e['job']['name'].split('.', 1)[1]} {e['eventType']}"] = e
        if wanted <= set(found) or time.monotonic() > deadline:
            assert wanted <= set(found), sorted(found)
            return found
        time.sleep(0.5)


def _names(datasets: List[Dict[str, Any]]) -> List[tuple]:
    return sorted((d["namespace"], d["name"]) for d in datasets)


def test_openlineage_events_carry_the_stages_datasets_and_mlflow_runs(
    reference: Dict[str, Any],
) -> None:
    handles, run_dir = reference["handles"], reference["run_dir"]
    events = _openlineage_events(handles)
    data, model, metrics = (("file", str(run_dir / d)) for d in ("data", "model", "eval"))

    prep = events["datapreproc COMPLETE"]
    assert _names(prep["inputs"]) == [] and _names(prep["outputs"]) == [data]
    manifest = json.loads((run_dir / "data" / "manifest.json").read_text())
    facets = prep["outputs"][0]["facets"]
    assert facets["version"]["datasetVersion"] == manifest["digest"]
    assert facets["datasetType"]["datasetType"] == "DATASET"

    train = events["train COMPLETE"]
    assert _names(train["inputs"]) == [data] and _names(train["outputs"]) == [model]
    assert train["outputs"][0]["facets"]["datasetType"]["datasetType"] == "MODEL"

    evaluate = events["evaluate COMPLETE"]
    assert _names(evaluate["inputs"]) == sorted([data, model])
    assert _names(evaluate["outputs"]) == [metrics]

    tracker = _tracker(reference["url"])
    for stage in STAGES:
        facet = events[f"{stage} COMPLETE"]["run"]["facets"]["torchx"]
        rid = tracker.mlflow_run_id(handles[stage])
        exp = tracker.client.get_run(rid).info.experiment_id
        assert facet["appHandle"] == handles[stage] and facet["scheduler"] == "local_cwd"
        assert facet["tracker"] == "mlflow" and facet["trackerRunId"] == rid
        assert facet["trackerRunUrl"] == f"{reference['url']}/#/experiments/{exp}/runs/{rid}"
        metrics = tracker.client.get_run(rid).data.metrics  # the run's resource-hours
        assert facet["cpuHours"] == metrics["cpu_hours"] > 0 and facet["gpuHours"] == 0
        start = events[f"{stage} START"]["run"]["facets"]["torchx"]
        assert start["component"].endswith(
            f"components.py:{'trainer' if stage == 'train' else stage}"
        )


def test_stage_outputs_are_airflow_asset_events(reference: Dict[str, Any]) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dag_run, run_dir, handles = reference["dag_run"], reference["run_dir"], reference["handles"]
    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.source_task_id, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_run_id == dag_run.run_id)
        ).all()
    events = {uri: (task, extra) for uri, task, extra in rows}
    # one stable Asset per stage (not one per run's path), the run's path in the extra
    assert sorted(events) == sorted(f"x-torchx://{DAG_ID}/{s}" for s in STAGES)
    tracker = _tracker(reference["url"])
    for stage, out, artifact in (
        ("datapreproc", "data", "dataset"),
        ("train", "model", "model"),
        ("evaluate", "eval", "metrics"),
    ):
        task, extra = events[f"x-torchx://{DAG_ID}/{stage}"]
        assert task == stage
        assert extra["uri"] == f"file://{run_dir / out}"
        assert extra["torchx_artifact"] == artifact
        assert extra["torchx_app_handle"] == handles[stage]
        assert extra["tracker_run_id"] == tracker.mlflow_run_id(handles[stage])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read()


def test_extra_links_are_http_urls_of_the_mlflow_runs(reference: Dict[str, Any]) -> None:
    dag_run, handles, url = reference["dag_run"], reference["handles"], reference["url"]
    tracker = _tracker(url)
    for stage in STAGES:
        link = _xcom(dag_run, stage, "_link_TorchXMLflowLink")
        rid = tracker.mlflow_run_id(handles[stage])
        exp = tracker.client.get_run(rid).info.experiment_id
        assert link == f"{url}/#/experiments/{exp}/runs/{rid}"
        status, body = _get(f"{url}/api/2.0/mlflow/runs/get?run_id={rid}")  # the run is there
        assert status == 200 and json.loads(body)["run"]["info"]["run_id"] == rid
    status, body = _get(link.split("#", 1)[0])  # and the link opens the MLflow UI
    assert status == 200 and b"<html" in body.lower()


SH_DAG = textwrap.dedent("""
    from datetime import datetime
    from airflow.sdk import DAG, Param
    from torchx.pipelines.airflow import TorchXOperator, close_pipeline_run

    with DAG(
        dag_id="sh_stages", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
        params={"lr": Param(0.1, type="number")},
        on_success_callback=close_pipeline_run, on_failure_callback=close_pipeline_run,
    ) as dag:
        prep = TorchXOperator(
            task_id="prep", component="utils.sh", component_args={"args": ["echo", "prep"]},
            poll_interval=0.5,
        )
        train = TorchXOperator(
            task_id="train", component="utils.sh", component_args=["echo", "train"],
            deferrable=True, poll_interval=0.5,
        )
        report = TorchXOperator(
            task_id="report", component="utils.sh", component_args=["true"], poll_interval=0.5
        )
        prep >> train >> report
""")


def test_stages_without_tracker_calls_each_get_a_finished_run_with_params(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path
) -> None:
    """``utils.sh`` never calls the tracker: the launcher owns each stage's run."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", server)
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "sh_stages.py"
    source.write_text(SH_DAG)
    conf = {"note": "first", "db_password": "pw-4711", "creds": {"api_key": "k-4711", "r": "eu"}}
    dag_run = _load_dag("sh_stages", source).test(run_conf=conf)
    assert _states(dag_run) == {t: "success" for t in ("prep", "train", "report")}

    tracker = _tracker(server)
    parent = tracker.client.get_run(tracker.mlflow_run_id(f"airflow://sh_stages/{dag_run.run_id}"))
    assert parent.info.status == "FINISHED"
    children = tracker.client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
    )
    runs = {r.info.run_name: r for r in children}
    assert sorted(runs) == ["prep", "report", "train"]  # one run per stage, named by task
    for task_id, run in runs.items():
        assert run.info.status == "FINISHED" and run.info.end_time, task_id
        params = run.data.params
        assert params["component"] == "utils.sh"
        assert params["airflow.dag_id"] == "sh_stages"
        assert params["airflow.task_id"] == task_id
        assert params["airflow.run_id"] == dag_run.run_id
        assert params["airflow.try_number"] == "1"
        assert params["airflow.params.lr"] == "0.1"
        assert params["airflow.params.note"] == "first"  # Airflow merges the run's conf
        # what Airflow masks (its sensitive names, nested too) is redacted; the rest stays
        assert params["airflow.params.db_password"] == "***"
        assert params["airflow.params.creds"] == '{"api_key": "***", "r": "eu"}'
        link = _xcom(dag_run, task_id, "_link_TorchXMLflowLink")  # deferred or not
        assert link == f"{server}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"


def test_a_declared_outlet_gets_the_recorded_output_extra(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path
) -> None:
    """A stage's own record_output of a path the DAG declared as an outlet Asset extends that
    Asset's event (no second event through the alias); OpenLineage names it once."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", server)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scores"
    code = (
        "import os; from torchx.trackers import record_output;"
        f" os.makedirs({str(out)!r}, exist_ok=True);"
        f" open(os.path.join({str(out)!r}, 's.txt'), 'w').write('1');"
        f" record_output({str(out)!r}, 'scores', {{'type': 'metrics'}})"
    )
    source = tmp_path / "declared_outlet.py"
    source.write_text(
        textwrap.dedent(f"""
        from datetime import datetime
        from airflow.sdk import DAG, Asset
        from torchx.pipelines.airflow import TorchXOperator

        with DAG(dag_id="declared_outlet", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
            TorchXOperator(
                task_id="score", component="utils.python", component_args=["--c", {code!r}],
                outlets=[Asset("file://{out}")], poll_interval=0.5,
            )
        """)
    )
    dag_run = _load_dag("declared_outlet", source).test()
    assert _states(dag_run) == {"score": "success"}

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_run_id == dag_run.run_id)
        ).all()
    events = dict(rows)
    # one event on the declared Asset; the stage's own Asset only names the app
    assert sorted(events) == sorted([f"file://{out}", "x-torchx://declared_outlet/score"])
    extra = events[f"file://{out}"]
    assert extra["torchx_artifact"] == "scores" and extra["type"] == "metrics"
    handle = _xcom(dag_run, "score", "app_handle")
    assert extra["tracker_run_id"] == _tracker(server).mlflow_run_id(handle)
    assert events["x-torchx://declared_outlet/score"] == {"torchx_app_handle": handle}
