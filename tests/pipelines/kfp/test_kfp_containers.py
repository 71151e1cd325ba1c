"""KFP in containers: a compiled pipeline holds nothing of the compiling machine, the
launcher's own container gets the env set on its task, and the reference pipeline runs
with ``kfp.local.DockerRunner`` on the real Docker engine (``$DOCKER_HOST``) in torchx's
image (``$TORCHX_KFP_BASE_IMAGE``, default ``torchx.IMAGE``)."""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Mapping

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PIPELINE = ROOT / "examples" / "pipelines" / "kfp" / "reference_pipeline.py"
RUN_LOCAL = ROOT / "examples" / "pipelines" / "kfp" / "run_local.py"
STAGES = ("datapreproc", "trainer", "evaluate")


def _without(env: Mapping[str, str], *names: str) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def _compile(tmp_path: Path, **env: str) -> str:
    out = tmp_path / "pipeline.yaml"
    subprocess.run(
        [sys.executable, "-m", "torchx.pipelines.kfp.compile", f"{PIPELINE}:reference_pipeline"]
        + [str(out)],
        check=True,
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
        env={**_without(os.environ, "TORCHX_KFP_BASE_IMAGE", "TORCHX_EXAMPLE_COMPONENTS"), **env},
    )
    return out.read_text()


def _launchers(ir: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Each stage's launcher task: its component argument and its container's resources."""
    tasks = ir["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    executors = ir["deploymentSpec"]["executors"]
    found = {}
    for name, task in tasks.items():
        component = task["inputs"]["parameters"]["component"]["runtimeValue"]["constant"]
        container = executors[f"exec-{name}"]["container"]
        found[component.rpartition(":")[2]] = {
            "component": component,
            "resources": container.get("resources", {}),
        }
    return found


def test_compiled_reference_pipeline_names_no_upstream_image_and_no_local_path(
    tmp_path: Path,
) -> None:
    text = _compile(tmp_path)
    assert "ghcr.io/pytorch/torchx" not in text
    for local in {str(ROOT), str(tmp_path), sys.prefix, os.path.expanduser("~")} - {"/"}:
        assert local not in text, f"the compiled pipeline names {local}"
    ir = yaml.safe_load(text)
    import torchx

    images = {e["container"]["image"] for e in ir["deploymentSpec"]["executors"].values()}
    assert images == {torchx.IMAGE}
    launchers = _launchers(ir)
    assert {s: launchers[s]["component"] for s in STAGES} == {
        s: f"examples.components:{s}" for s in STAGES
    }
    train = launchers["trainer"]["resources"]
    assert (train["resourceCpuLimit"], train["resourceMemoryLimit"]) == ("1", "2048Mi")


def test_an_in_image_components_path_keeps_the_stages_resources(tmp_path: Path) -> None:
    default = _launchers(yaml.safe_load(_compile(tmp_path)))
    in_image = "/opt/app/components.py"  # no such file on this machine
    moved = _launchers(yaml.safe_load(_compile(tmp_path, TORCHX_EXAMPLE_COMPONENTS=in_image)))
    assert {s: moved[s]["component"] for s in STAGES} == {s: f"{in_image}:{s}" for s in STAGES}
    assert {s: moved[s]["resources"] for s in STAGES} == {
        s: default[s]["resources"] for s in STAGES
    }
    # each stage's cpu and memory (the 6 lines an in-image path used to drop)
    limits = [k for s in STAGES for k in moved[s]["resources"] if k.startswith("resource")]
    assert limits.count("resourceCpuLimit") == 3
    assert limits.count("resourceMemoryLimit") == 3


def test_env_set_on_a_launcher_task_reaches_its_own_container(tmp_path: Path) -> None:
    from kfp import compiler, dsl

    from torchx.pipelines.kfp.components import torchx_launcher

    @dsl.pipeline(name="launcher-env")
    def launcher_env() -> None:
        task = torchx_launcher(component="utils.echo", component_args=["--msg", "hi"])
        task.set_env_variable("TORCHX_TRACKER_MLFLOW_CONFIG", "https://mlflow.example.com")

    out = tmp_path / "env.yaml"
    compiler.Compiler().compile(launcher_env, str(out))
    ir = yaml.safe_load(out.read_text())
    container = ir["deploymentSpec"]["executors"]["exec-torchx-launcher"]["container"]
    assert {"name": "TORCHX_TRACKER_MLFLOW_CONFIG", "value": "https://mlflow.example.com"} in (
        container["env"]
    )
    # KFP's driver gives the launcher's pod the task's env only when the passthrough applies
    # it to the task as well as handing it to the app (resources go to the app alone)
    passthroughs = {
        p["field"]: p.get("applyToTask", False)
        for p in ir["components"]["comp-torchx-launcher"]["taskConfigPassthroughs"]
    }
    assert passthroughs["ENV"] is True
    assert passthroughs["RESOURCES"] is False


def _engine_with_image() -> str:
    """The image the steps run in, or skip: no ``$DOCKER_HOST``, no engine, no image."""
    if not os.environ.get("DOCKER_HOST"):
        pytest.skip("DOCKER_HOST is unset: no Docker engine for the container tests")
    docker = pytest.importorskip("docker")
    from torchx.pipelines.kfp.image import base_image

    image = base_image()
    try:
        client = docker.from_env()
        try:
            client.images.get(image)
        finally:
            client.close()
    except docker.errors.ImageNotFound:
        pytest.skip(f"image {image} is not built (docker build -t {image} .)")
    except docker.errors.DockerException as e:
        pytest.skip(f"Docker engine at {os.environ['DOCKER_HOST']} does not answer: {e}")
    return image


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 105 s on a quiet 2-core machine, 376 s in a loaded test run
def test_reference_pipeline_runs_in_containers_with_docker_runner(tmp_path: Path) -> None:
    image = _engine_with_image()
    env = _without(os.environ, "TORCHXCONFIG", "TORCHX_TRACKERS", "TORCHX_TRACKER_MLFLOW_CONFIG")
    run = subprocess.run(
        [sys.executable, str(RUN_LOCAL), "--runner", "docker", "--out", str(tmp_path)]
        + ["--epochs", "3", "--limit", "500", "--j", "1x2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1080,  # fails here, before pytest-timeout stops the test
        cwd=tmp_path,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    accuracy = re.search(r"^test accuracy: (\d\.\d+)$", run.stdout, re.M)
    assert accuracy is not None, log[-2000:]
    assert float(accuracy.group(1)) > 0.2  # ten digits: a guess scores 0.1
    # five steps (start, three launchers, close), each in a container of the image
    assert log.count(f"Found image '{image}'") == 5
    assert "pip install" not in log  # the image has kfp: no install at step start
    assert "train/0 [1]:" in log  # the 2-process DDP stage ran in its launcher's container
    from torchx.trackers.api import build_trackers

    # the containers reported to the MLflow server on the host, stored in OUT/mlflow.db
    tracker = build_trackers({"mlflow": f"sqlite:///{tmp_path / 'mlflow.db'}"})[0]
    [pipeline] = [r for r in tracker.run_ids() if r.startswith("kfp://torchx-reference/")]
    stages = list(tracker.run_ids(parent_run_id=pipeline))
    assert len(stages) == 3
    rid = tracker.mlflow_run_id(pipeline)  # type: ignore[attr-defined]
    assert tracker.client.get_run(rid).info.status == "FINISHED"  # type: ignore[attr-defined]
    [evaluate] = [s for s in stages if "evaluate" in s]
    assert {e.artifact for e in tracker.lineage(evaluate).upstream(evaluate)} == {
        "model",
        "dataset",
    }
