"""KFP pipelines run with kfp.local against real MLflow (sqlite): every stage has its run,
and the launcher returns the MLflow run id and typed outputs.

One kfp.local process per module (each KFP step is a subprocess importing torchx, kfp
and mlflow, so steps are the cost): a pipeline of ``utils.sh`` stages that never call the
tracker, then one launcher step whose stage logs metrics and records a model.
"""

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import kfp.local
    from kfp import dsl
    from torchx.pipelines.kfp.components import (
        close_pipeline_run, start_pipeline_run, torchx_launcher
    )

    root = sys.argv[1]
    kfp.local.init(
        runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=root + "/kfp_root"
    )

    @dsl.pipeline(name="sh-stages")
    def sh_stages(greeting: str = "hello") -> None:
        run = start_pipeline_run(
            pipeline_name="sh-stages", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
        )
        close = close_pipeline_run(
            pipeline_name="sh-stages", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
        )
        identity = dict(
            job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER
        )
        with dsl.ExitHandler(close):
            first = torchx_launcher(
                component="utils.sh",
                component_args=["echo", greeting],
                parent_run_id=run.output,
                **identity,
            )
            torchx_launcher(
                component="utils.sh",
                component_args=["echo", "second"],
                parent_run_id=run.output,
                **identity,
            ).after(first)

    sh_stages()

    stage = (
        "import os, sys; from torchx.trackers import app_run_from_env, record_output; "
        "d = sys.argv[1]; os.makedirs(d, exist_ok=True); open(d + '/w.bin', 'w').write('w'); "
        "app_run_from_env().log_metrics({'loss': 0.5}, step=1); "
        "app_run_from_env().log_metrics({'loss': 0.25}, step=2); "
        "from torchx.trackers import report_progress; report_progress(2, total=2, acc=0.75); "
        "record_output(d, 'model', {'type': 'model', 'steps': 2})"
    )
    task = torchx_launcher(component="utils.python", component_args=["--c", stage, root + "/model"])
    outputs = {
        k: v if isinstance(v, str) else {"uri": v.uri, "metadata": v.metadata}
        for k, v in task.outputs.items()
    }
    print("OUTPUTS " + json.dumps(outputs))
""")


@pytest.fixture(scope="module")
def kfp_run(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("kfp_tracking")
    env = dict(
        os.environ,
        TORCHX_HOME=str(root / "home"),
        TORCHX_TRACKERS="mlflow",
        TORCHX_TRACKER_MLFLOW_CONFIG=f"sqlite:///{root / 'mlflow.db'}",
    )
    env.pop("TORCHXCONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=root,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    outputs = json.loads(done.stdout.split("OUTPUTS ", 1)[1].splitlines()[0])
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments)
    return {"root": root, "outputs": outputs, "runs": runs, "client": client, "log": out}


def test_sh_stages_each_get_a_finished_run_with_params_under_the_pipeline_run(
    kfp_run: Dict[str, Any],
) -> None:
    runs = kfp_run["runs"]
    pipeline = [r for r in runs if r.info.run_name.startswith("kfp://sh-stages/")]
    assert len(pipeline) == 1 and pipeline[0].info.status == "FINISHED"
    stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == pipeline[0].info.run_id]
    assert sorted(r.info.run_name for r in stages) == ["torchx-launcher", "torchx-launcher-2"]
    job_id = pipeline[0].info.run_name.rpartition("/")[2]
    for stage in stages:
        params = stage.data.params
        assert stage.info.status == "FINISHED" and stage.info.end_time >= stage.info.start_time
        assert params["kfp.task_name"] == stage.info.run_name
        assert params["kfp.job_id"] == job_id and params["kfp.component"] == "utils.sh"
        assert params["kfp.parent_run_id"] == pipeline[0].info.run_name
        assert params["scheduler"] == "local_cwd"
    echoed = {json.loads(s.data.params["kfp.component_args"])[1] for s in stages}
    assert echoed == {"hello", "second"}
    # the exit handler summed the stages' resource-hours onto the pipeline run
    total = sum(s.data.metrics["cpu_hours"] for s in stages)
    assert total > 0 and pipeline[0].data.metrics["cpu_hours"] == pytest.approx(total)
    assert pipeline[0].data.metrics["gpu_hours"] == 0


def test_launcher_returns_the_mlflow_run_id_and_typed_outputs(kfp_run: Dict[str, Any]) -> None:
    outputs = kfp_run["outputs"]
    run = kfp_run["client"].get_run(outputs["tracker_run_id"])  # a real MLflow run id
    assert run.data.tags["torchx.job_id"] == outputs["app_handle"] != outputs["tracker_run_id"]
    assert outputs["tracker_run_url"] == ""  # a sqlite store has no UI: no fake link
    # rank 0's last value, its last progress report (step, total, its metrics), and the
    # app's resource-hours as on its run
    meta = dict(outputs["metrics"]["metadata"])
    hours = {k: meta.pop(k) for k in ("cpu_hours", "gpu_hours")}
    assert meta == {"loss": 0.25, "step": 2, "total": 2, "acc": 0.75}
    assert hours["cpu_hours"] == run.data.metrics["cpu_hours"] > 0 and hours["gpu_hours"] == 0
    model = outputs["model"]
    assert model["uri"] == str(kfp_run["root"] / "model")
    assert model["metadata"]["recorded"] is True and model["metadata"]["steps"] == "2"
    assert model["metadata"]["tracker_run_id"] == outputs["tracker_run_id"]
    assert outputs["dataset"]["metadata"]["recorded"] is False


KFP_OWNS_RUNS = textwrap.dedent("""
    import sys
    import kfp.local
    from torchx.pipelines.kfp.components import torchx_launcher

    kfp.local.init(
        runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[1] + "/root"
    )
    code = (
        "import mlflow; mlflow.start_run(); mlflow.log_metric('m', 1); mlflow.end_run()"
    )
    task = torchx_launcher(component="utils.python", component_args=["--c", code])
    print("RUN " + task.outputs["tracker_run_id"])
""")


def test_under_kfp_mlflow_integration_the_job_run_nests_under_kfps_task_run(
    tmp_path: Any,
) -> None:
    """KFP 2.17 sets MLFLOW_TRACKING_URI/RUN_ID/EXPERIMENT_ID in the step: tracking turns
    on from them (no TORCHX_TRACKERS), and the job's run nests under KFP's task run."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("kfp-pipeline")
    kfp_task = client.create_run(exp, run_name="kfp-task").info.run_id  # as KFP opens it
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHX_TRACKER")}
    env.update(
        TORCHX_HOME=str(tmp_path / "home"),
        MLFLOW_TRACKING_URI=uri,
        MLFLOW_RUN_ID=kfp_task,
        MLFLOW_EXPERIMENT_ID=exp,
    )
    done = subprocess.run(
        [sys.executable, "-c", KFP_OWNS_RUNS, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    job_run = client.get_run(done.stdout.split("RUN ", 1)[1].split()[0])
    assert job_run.data.tags["mlflow.parentRunId"] == kfp_task
    assert job_run.info.experiment_id == exp and job_run.info.status == "FINISHED"
    metrics = dict(job_run.data.metrics)
    assert metrics.pop("cpu_hours") > 0 and metrics.pop("gpu_hours") == 0  # torchx's, at the end
    assert metrics == {"m": 1.0}  # the user's own mlflow calls landed in it
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.info.run_id for r in runs) == sorted([kfp_task, job_run.info.run_id])
