"""A sweep in a real Airflow 3 deployment: ``TorchXOperator.partial(...).expand(...)`` over
20 stages gives one app, one idempotency key and one MLflow run per map index, every run
nested under the DAG run's pipeline run (an MLflow server, the deployment's processes as
its clients)."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import pytest

from tests.deployments.airflow_deployment import AirflowDeployment, airflow_deployment
from tests.mlflow_server import mlflow_server
from tests.polling import poll_until

WIDTH = 20
DAG_ID = "torchx_sweep"
DAGS = f"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from torchx.pipelines.airflow import TorchXOperator, close_pipeline_run

with DAG(
    dag_id="{DAG_ID}",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    on_success_callback=close_pipeline_run,
    on_failure_callback=close_pipeline_run,
) as dag:
    TorchXOperator.partial(
        task_id="sweep",
        component="utils.echo",
        poll_interval=0.5,
        retries=2,  # a retried map index re-attaches to its own app (its key)
        retry_delay=timedelta(seconds=1),
    ).expand(component_args=[["--msg", f"lr-{{i}}"] for i in range({WIDTH})])
"""
DEADLINE = 900.0  # 20 task processes, 8 at a time, on a loaded 2-core machine
# the DAG run took 5.5 min at a load average of 16 (2 cores), over 10 min at 60-120
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """One DAG run of the sweep, finished; its run id and the MLflow server's URL."""
    work = tmp_path_factory.mktemp("airflow-sweep")
    dags = work / "dags"
    dags.mkdir()
    (dags / "torchx_sweep.py").write_text(DAGS)
    with mlflow_server(work / "mlflow") as url, pytest.MonkeyPatch.context() as mp:
        torchx_env = {
            "TORCHX_HOME": str(work / "torchx_home"),
            "TORCHX_TRACKERS": "mlflow",
            "TORCHX_TRACKER_MLFLOW_CONFIG": url,
        }
        for k, v in torchx_env.items():  # this process reads the deployment's apps
            mp.setenv(k, v)
        loaded_machine = {
            # no crash to detect here: a task starved of CPU for 15 s (the deployment's
            # default, for crash tests) is not failed for a missed heartbeat
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "300",
            # the DAG's success callback (close_pipeline_run) runs in the dag-processor's
            # file processor: at a load average of 40 it outlived the default 50 s, was
            # killed, and left the pipeline run RUNNING
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "300",
        }
        with airflow_deployment(work, dags, {**torchx_env, **loaded_machine}) as af:
            af.unpause(DAG_ID)
            run_id = af.trigger(DAG_ID)
            af.wait_dag_run((DAG_ID, run_id, "sweep"), {"success", "failed"}, DEADLINE)
            yield {"af": af, "run_id": run_id, "mlflow": url}


def _task_instances(af: AirflowDeployment, run_id: str) -> List[Dict[str, Any]]:
    found = af.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")
    return [ti for ti in found["task_instances"] if ti["task_id"] == "sweep"]


def _failed_logs(af: AirflowDeployment, run_id: str, tis: List[Dict[str, Any]]) -> str:
    """The last try's log of every map index that did not succeed, and the scheduler's."""
    parts = []
    for ti in tis:
        if ti["state"] != "success":
            path = (
                f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/sweep/logs/"
                f"{ti['try_number']}?map_index={ti['map_index']}&full_content=true"
            )
            found = af.api("GET", path)
            content = found.get("content", found) if isinstance(found, dict) else found
            parts.append(f"--- map index {ti['map_index']} ({ti['state']}):\n{content}"[-4000:])
    return "\n".join(parts) + f"\n--- scheduler:\n{af.log_tail()}"


@pytest.mark.slow
def test_every_map_index_succeeds_with_its_own_app_and_key(sweep: Dict[str, Any]) -> None:
    from torchx.schedulers.api import idempotency_token
    from torchx.schedulers.local_scheduler import create_scheduler

    af, run_id = sweep["af"], sweep["run_id"]
    tis = _task_instances(af, run_id)
    assert sorted((ti["map_index"], ti["state"]) for ti in tis) == [
        (i, "success") for i in range(WIDTH)
    ], _failed_logs(af, run_id, tis)
    scheduler = create_scheduler("torchx")
    app_ids = []
    for i in range(WIDTH):
        key = f"airflow/{DAG_ID}/sweep/{run_id}/{i}"
        apps = scheduler.find_by_idempotency_token(idempotency_token(key))
        assert [a.state.name for a in apps] == ["SUCCEEDED"], (key, apps)
        app_ids.append(apps[0].app_id)
    assert len(set(app_ids)) == WIDTH, app_ids


@pytest.mark.slow
def test_one_mlflow_run_per_map_index_nested_under_the_pipeline_run(
    sweep: Dict[str, Any],
) -> None:
    from torchx.runner import get_runner
    from torchx.trackers.api import build_trackers

    tracker: Any = build_trackers({"mlflow": sweep["mlflow"]})[0]
    pipeline = f"airflow://{DAG_ID}/{sweep['run_id']}"
    with get_runner() as runner:
        handles = sorted(a.app_handle for a in runner.list("local_cwd"))
    assert len(handles) == WIDTH
    assert sorted(tracker.run_ids(parent_run_id=pipeline)) == handles
    by_index = {}
    for handle in handles:
        run = tracker.client.get_run(tracker.mlflow_run_id(handle))
        assert run.info.status == "FINISHED", (handle, run.info.status)
        by_index[int(run.data.params["airflow.map_index"])] = run.info.run_name
    assert by_index == {i: f"sweep[{i}]" for i in range(WIDTH)}
    # the DAG's success callback ends it, after the DAG run is marked success
    parent = tracker.mlflow_run_id(pipeline)
    status = poll_until(
        lambda: tracker.client.get_run(parent).info.status, lambda s: s != "RUNNING", 120, 0.5
    )
    assert status == "FINISHED"
