"""KFP v2: compiled IR checked field by field; the reference pipeline run with kfp.local."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import yaml

import torchx
from tests.processes import wait_for_job_processes
from torchx import specs
from torchx.components import dist, utils

ROOT = Path(__file__).resolve().parents[3]
PIPELINE = ROOT / "examples" / "pipelines" / "kfp" / "reference_pipeline.py"


def test_reference_pipeline_compiles_to_ir_with_dag_edges(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torchx.pipelines.kfp.compile",
            f"{PIPELINE}:reference_pipeline",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    ir = yaml.safe_load(out.read_text())
    root = ir["root"]["dag"]["tasks"]
    assert set(root) == {"start-pipeline-run", "exit-handler-1", "close-pipeline-run"}
    # the exit handler closes the pipeline's tracker run whatever happened to the stages
    assert root["close-pipeline-run"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert root["exit-handler-1"]["dependentTasks"] == ["start-pipeline-run"]
    tasks = ir["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert set(tasks) == {"torchx-launcher", "torchx-launcher-2", "torchx-launcher-3"}
    assert tasks["torchx-launcher-2"]["dependentTasks"] == ["torchx-launcher"]
    assert tasks["torchx-launcher-3"]["dependentTasks"] == ["torchx-launcher-2"]
    # every launcher is keyed by the pipeline job and its task name (re-attaching retries)
    params = tasks["torchx-launcher-2"]["inputs"]["parameters"]
    assert params["job_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    assert params["task_name"]["runtimeValue"]["constant"] == "{{$.pipeline_task_name}}"
    executors = ir["deploymentSpec"]["executors"]
    launcher = executors["exec-torchx-launcher"]["container"]
    assert launcher["image"] == torchx.IMAGE
    assert "torchx.pipelines.kfp.launch" in " ".join(launcher["command"])
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert {"base_dir", "scheduler", "j", "epochs", "train_cfg"} <= set(params)
    assert params["j"]["defaultValue"] == "1:2x1"
    assert ir["components"]["comp-torchx-launcher"]["taskConfigPassthroughs"]
    # the train task carries one node's resources (the trainer's cpu=1, memMB=2048)
    train_res = executors["exec-torchx-launcher-2"]["container"]["resources"]
    assert train_res["resourceCpuLimit"] == train_res["resourceCpuRequest"] == "1"
    assert train_res["resourceMemoryLimit"] == train_res["resourceMemoryRequest"] == "2048Mi"
    # typed outputs, and our documentation rather than KFP's
    outputs = ir["components"]["comp-torchx-launcher-2"]["outputDefinitions"]
    assert outputs["artifacts"]["model"]["artifactType"]["schemaTitle"] == "system.Model"
    assert outputs["artifacts"]["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert set(outputs["parameters"]) == {"app_handle", "tracker_run_id", "tracker_run_url"}
    inputs = ir["components"]["comp-torchx-launcher-2"]["inputDefinitions"]["parameters"]
    assert "keys the submission" in inputs["task_name"]["description"]


def test_container_component_from_single_role_app(tmp_path: Path) -> None:
    from kfp import compiler, dsl

    from torchx.pipelines.kfp import component_from_app

    app = utils.python(
        "--out",
        "${output:model}",
        "--data",
        "${input:data}",
        "--epochs",
        "${param:epochs}",
        m="trainer.main",
        cpu=2,
        memMB=3000,
        gpu=1,
    )
    train = component_from_app(
        app,
        inputs={"data": "Dataset", "epochs": "Integer"},
        outputs={"model": "Model"},
        trackers={},
    )
    prep = component_from_app(
        specs.AppDef(
            "prep",
            [
                specs.Role(
                    "prep",
                    "img:1",
                    entrypoint="prep",
                    args=["--out", "${output:data}"],
                    resource=specs.resource(cpu=1, memMB=512),
                )
            ],
        ),
        outputs={"data": "Dataset"},
        trackers={},
    )

    @dsl.pipeline(name="two-steps")
    def two_steps(epochs: int = 3) -> None:
        p = prep()
        train(data=p.outputs["data"], epochs=epochs)

    out = tmp_path / "two.yaml"
    compiler.Compiler().compile(two_steps, str(out))
    ir = yaml.safe_load(out.read_text())
    ex = ir["deploymentSpec"]["executors"]
    train_exec = next(v["container"] for k, v in ex.items() if "python" in k)
    assert train_exec["image"] == app.roles[0].image and train_exec["command"] == ["python"]
    assert train_exec["args"][:2] == ["-m", "trainer.main"]
    assert (
        train_exec["resources"]["cpuLimit"] == 2.0 and train_exec["resources"]["memoryLimit"] == 3.0
    )
    assert train_exec["resources"]["accelerator"]["count"] == "1"
    assert "{{$.outputs.artifacts['model'].path}}" in train_exec["args"]
    tasks = ir["root"]["dag"]["tasks"]
    train_task = next(v for k, v in tasks.items() if "python" in k)
    assert (
        train_task["inputs"]["artifacts"]["data"]["taskOutputArtifact"]["outputArtifactKey"]
        == "data"
    )


def test_distributed_app_is_refused_with_a_pointer_to_the_launcher() -> None:
    from torchx.pipelines.kfp import component_from_app

    with pytest.raises(specs.InvalidArgumentError, match="torchx_launcher"):
        component_from_app(dist.ddp(script="t.py", j="2x2"))


def _kfp_env(tmp_path: Path) -> dict:
    env = dict(
        os.environ,
        TORCHX_HOME=str(tmp_path / "home"),
        TORCHX_TRACKERS="mlflow",
        TORCHX_TRACKER_MLFLOW_CONFIG=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    env.pop("TORCHXCONFIG", None)
    return env


@pytest.mark.slow
def test_reference_pipeline_runs_with_kfp_local_and_records_lineage(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "pipelines" / "kfp" / "run_local.py"),
            "--out",
            str(tmp_path),
            "--epochs",
            "3",
            "--limit",
            "500",
            "--j",
            "1x2",
        ],
        env=_kfp_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "test accuracy:" in run.stdout
    assert (
        "train/0 [1]:" in run.stdout + run.stderr
    )  # the 2-process DDP stage's log reached the step log
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": f"sqlite:///{tmp_path / 'mlflow.db'}"})[0]
    pipeline = [r for r in tracker.run_ids() if r.startswith("kfp://torchx-reference/")]
    assert len(pipeline) == 1
    stages = list(tracker.run_ids(parent_run_id=pipeline[0]))
    assert len(stages) == 3
    rid = tracker.mlflow_run_id(pipeline[0])  # type: ignore[attr-defined]
    assert tracker.client.get_run(rid).info.status == "FINISHED"  # type: ignore[attr-defined]
    evaluate = [s for s in stages if "evaluate" in s][0]
    assert {e.artifact for e in tracker.lineage(evaluate).upstream(evaluate)} == {
        "model",
        "dataset",
    }


def test_failing_training_stage_fails_the_run_with_the_workers_error(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import kfp.local
        from kfp import dsl
        from torchx.pipelines.kfp.components import (
            close_pipeline_run, start_pipeline_run, torchx_launcher
        )

        @dsl.pipeline(name="failing")
        def failing() -> None:
            run = start_pipeline_run(
                pipeline_name="failing", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
            )
            close = close_pipeline_run(
                pipeline_name="failing", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
            )
            with dsl.ExitHandler(close):
                torchx_launcher(
                    component="utils.python",
                    component_args=["--c", "raise ValueError('diverged at step 7')"],
                    parent_run_id=run.output,
                )

        kfp.local.init(
            runner=kfp.local.SubprocessRunner(use_venv=False),
            pipeline_root={str(tmp_path / "root")!r},
        )
        failing()
    """)
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=_kfp_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "ValueError: diverged at step 7" in out and "FAILED" in out
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": f"sqlite:///{tmp_path / 'mlflow.db'}"})[0]
    pipeline = [r for r in tracker.run_ids() if r.startswith("kfp://failing/")]
    rid = tracker.mlflow_run_id(pipeline[0])  # type: ignore[attr-defined]
    assert tracker.client.get_run(rid).info.status == "FAILED"  # type: ignore[attr-defined]


def test_retried_launcher_step_reattaches_under_kfp_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try's launcher dies (SIGKILL, as a lost pod); KFP's retry of the same task
    in the same pipeline job finds the app through the scheduler and waits on it."""
    first_try = (
        "from torchx.pipelines.kfp.launch import launch, launcher_key; "
        "launch('utils.sh', ['sh', '-c', 'sleep 4; echo stage-done'],"
        " idempotency_key=launcher_key('job-1', 'train'))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", first_try],
        env=_kfp_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    handle = proc.stdout.readline().split()[-1]
    assert handle.startswith("local_cwd://")
    proc.kill()
    proc.wait(timeout=30)
    code = textwrap.dedent(f"""
        import kfp.local
        from kfp import dsl
        from torchx.pipelines.kfp.components import torchx_launcher

        @dsl.pipeline(name="retry")
        def retry(job_id: str) -> str:
            return torchx_launcher(
                component="utils.sh",
                component_args=["sh", "-c", "sleep 4; echo stage-done"],
                job_id=job_id,
                task_name="train",
            ).outputs["app_handle"]

        kfp.local.init(
            runner=kfp.local.SubprocessRunner(use_venv=False),
            pipeline_root={str(tmp_path / "root")!r},
        )
        print("HANDLE", retry(job_id="job-1").output)
    """)
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=_kfp_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert f"HANDLE {handle}" in out and f"re-attached to {handle}" in out
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    with get_runner(trackers={}) as runner:
        assert [a.app_handle for a in runner.list("local_cwd")] == [handle]


def test_terminating_the_launcher_cancels_the_app(tmp_path: Path) -> None:
    code = (
        "from torchx.pipelines.kfp.launch import launch; "
        "launch('utils.sh', ['--num_replicas', '2', 'sleep', '600'])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=_kfp_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    handle = proc.stdout.readline().split()[-1]
    assert handle.startswith("local_cwd://")
    sleeps = wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=30)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(sleeps, timeout=30)
    assert alive == []


def test_the_launcher_puts_the_callers_sigterm_handler_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch's SIGTERM handler (cancel the app) serves the launch only: after a stage
    that succeeded or failed, the caller's own handler is in place again."""
    from torchx.pipelines.kfp.launch import launch

    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path)

    def callers(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGTERM, callers)
    try:
        launch("utils.sh", ["true"])
        assert signal.getsignal(signal.SIGTERM) is callers
        with pytest.raises(RuntimeError):
            launch("utils.sh", ["false"])
        assert signal.getsignal(signal.SIGTERM) is callers
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_launcher_refuses_a_misspelled_run_option_but_not_the_task_configs_selector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's cfg is checked like any other; the launcher task's node selector goes
    only where the scheduler has one (local_cwd does not)."""
    from torchx.pipelines.kfp.launch import launch
    from torchx.specs import InvalidRunConfigException

    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidRunConfigException, match="Unknown run option 'log_dri'"):
        launch("utils.sh", ["touch", "ran"], cfg={"log_dri": str(tmp_path)})
    assert not (tmp_path / "ran").exists()
    launch("utils.sh", ["touch", "ran"], task_config={"node_selector": {"pool": "gpu"}})
    assert (tmp_path / "ran").exists()


def test_task_config_is_forwarded_to_the_app() -> None:
    from torchx.pipelines.kfp.launch import apply_task_config

    app = utils.sh("true", cpu=1, memMB=1024)
    cfg: dict = {}
    apply_task_config(
        app,
        cfg,
        {
            "resources": {"limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}},
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
            "node_selector": {"pool": "gpu"},
        },
    )
    res = app.roles[0].resource
    assert (res.cpu, res.memMB, res.gpu) == (4, 8192, 2) and app.roles[0].env[
        "NCCL_DEBUG"
    ] == "INFO"
    assert cfg == {"node_selector": {"pool": "gpu"}}


def test_task_config_quantities_mean_what_they_mean_on_kubernetes() -> None:
    """One quantity parser: ``8G`` is 8e9 bytes (7629 MiB) here as in the k8s scheduler."""
    from torchx.pipelines.kfp.launch import apply_task_config
    from torchx.util.quantity import memory_mib

    app = utils.sh("true", cpu=1, memMB=1024)
    apply_task_config(app, {}, {"resources": {"limits": {"cpu": "500m", "memory": "8G"}}})
    res = app.roles[0].resource
    assert (res.cpu, res.memMB) == (1, 7629) == (1, memory_mib("8G"))
