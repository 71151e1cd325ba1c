"""KFP pipelines as built and compiled: task resources, container components' tracker env
and macros, the base image setting and the components' documentation in the IR."""

import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import yaml

from tests.pipelines.kfp.kfp_run import resolve_executor, run
from torchx import specs
from torchx.components import utils


def _compile(pipeline: Callable[..., Any], tmp_path: Path) -> Dict[str, Any]:
    from kfp import compiler

    out = tmp_path / f"{pipeline.name}.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    return yaml.safe_load(out.read_text())


def _resources(ir: Dict[str, Any], executor: str) -> Dict[str, Any]:
    return ir["deploymentSpec"]["executors"][executor]["container"].get("resources", {})


def test_launcher_task_carries_the_apps_replica_resources(tmp_path: Path) -> None:
    from kfp import dsl

    from torchx.pipelines.kfp import torchx_launcher

    ddp = ["-j", "2x2", "--cpu", "3", "--memMB", "1500", "--gpu", "1", "--script", "t.py"]

    @dsl.pipeline(name="resources")
    def resources(cpu: int = 5, data: str = "/data") -> None:
        torchx_launcher(component="dist.ddp", component_args=ddp, scheduler="kubernetes")
        # a pipeline parameter: a runtime cpu resource; the others are the component's
        torchx_launcher(
            component="dist.ddp",
            component_args=["--cpu", cpu, "--script", "t.py", "--", f"{data}/x"],
        )
        # a user's own setting on the task wins
        torchx_launcher(component="utils.sh", component_args=["true"]).set_cpu_limit("7")

    ir = _compile(resources, tmp_path)
    fixed = _resources(ir, "exec-torchx-launcher")
    assert fixed["resourceCpuLimit"] == fixed["resourceCpuRequest"] == "3"
    assert fixed["resourceMemoryLimit"] == fixed["resourceMemoryRequest"] == "1500Mi"
    assert fixed["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert fixed["accelerator"]["resourceCount"] == "1"
    dynamic = _resources(ir, "exec-torchx-launcher-2")
    assert dynamic["resourceCpuLimit"] == "{{$.inputs.parameters['pipelinechannel--cpu']}}"
    assert dynamic["resourceMemoryLimit"] == "1024Mi"  # dist.ddp's default memMB
    assert _resources(ir, "exec-torchx-launcher-3")["resourceCpuLimit"] == "7"


def test_invalid_launcher_args_fail_when_the_pipeline_is_built() -> None:
    from kfp import dsl

    from torchx.pipelines.kfp import torchx_launcher

    with pytest.raises(specs.InvalidArgumentError, match="invalid -j '2y2'"):

        @dsl.pipeline(name="bad")
        def bad() -> None:
            torchx_launcher(component="dist.ddp", component_args=["-j", "2y2", "--script", "t"])


def test_resources_come_back_to_the_app_unchanged() -> None:
    """What the IR carries is what the launcher's task config gives the app back."""
    from torchx.pipelines.kfp.launch import apply_task_config

    app = utils.sh("true", cpu=3, memMB=1500)
    apply_task_config(app, {}, {"resources": {"limits": {"cpu": "3", "memory": "1500Mi"}}})
    assert (app.roles[0].resource.cpu, app.roles[0].resource.memMB) == (3, 1500)


def test_container_component_runs_with_tracker_env_and_kfp_macros(tmp_path: Path) -> None:
    """The compiled command, resolved by KFP's own placeholder code, runs the program with
    the tracker env, a job id naming the pipeline job and task, and no macro left."""
    from kfp import dsl

    from torchx.pipelines.kfp import component_from_app

    program = (
        "import os, sys; from torchx.trackers import app_run_from_env; "
        "app_run_from_env().add_metadata(stage='prep'); "
        "print('ARGV', sys.argv[1:]); print('JOB', os.environ['TORCHX_JOB_ID']); "
        "print('ENV', os.environ['RUN_TAG'])"
    )
    app = specs.AppDef(
        "prep",
        [
            specs.Role(
                "prep",
                "img:1",
                entrypoint=sys.executable,
                args=["-c", program, "${app_id}", "r${replica_id}", "$${HOME}", "${output:data}"],
                env={"RUN_TAG": "tag-${app_id}", "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        ],
    )
    trackers = {"fsspec": str(tmp_path / "tracking")}
    prep = component_from_app(app, outputs={"data": "Dataset"}, trackers=trackers)

    @dsl.pipeline(name="p")
    def p(parent: str) -> None:
        prep(parent_run_id=parent)

    ir_path = tmp_path / "p.yaml"
    from kfp import compiler

    compiler.Compiler().compile(p, str(ir_path))
    macros = r"\$\{(app_id|replica_id|img_root|base_img_root|rank0_env)\}"
    assert re.search(macros, ir_path.read_text()) is None
    task = next(iter(yaml.safe_load(ir_path.read_text())["root"]["dag"]["tasks"]))
    args = {
        "torchx_job_uuid": "{{$.pipeline_job_uuid}}",
        "torchx_task_uuid": "{{$.pipeline_task_uuid}}",
    }
    command, env = resolve_executor(
        str(ir_path), task, {**args, "torchx_parent_run_id": "kfp://p/job-42"}, str(tmp_path)
    )
    assert env["TORCHX_TRACKERS"] == "fsspec"
    out = run(command, {**os.environ, **env, "HOME": "/home/x"})
    argv = eval(out.split("ARGV ", 1)[1].splitlines()[0])
    task_id = argv[0]
    assert task_id and "{{" not in task_id and argv[1:3] == ["r0", "${HOME}"]
    assert argv[3].startswith(str(tmp_path))  # the output artifact's local path
    assert f"JOB kfp://job-42/{task_id}" in out and f"ENV tag-{task_id}" in out
    from torchx.trackers.api import build_trackers

    tracker = build_trackers(trackers)[0]
    assert tracker.metadata(f"kfp://job-42/{task_id}")["stage"] == "prep"
    assert list(tracker.run_ids(parent_run_id="kfp://p/job-42")) == [f"kfp://job-42/{task_id}"]


def test_base_image_is_one_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kfp import dsl

    from torchx.pipelines.kfp import component_from_app, start_pipeline_run, torchx_launcher
    from torchx.pipelines.kfp.image import ENV_BASE_IMAGE

    monkeypatch.setenv(ENV_BASE_IMAGE, "registry.example/torchx:7")
    default_image = component_from_app(utils.python(c="print(1)"), trackers={})
    own_image = component_from_app(utils.python(c="print(1)", image="mine:1"), trackers={})
    chosen = component_from_app(utils.python(c="print(1)"), image="chosen:2", trackers={})

    @dsl.pipeline(name="images")
    def images() -> None:
        start_pipeline_run(pipeline_name="images", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        torchx_launcher(component="utils.sh", component_args=["true"])
        default_image()
        own_image()
        chosen()

    ir = _compile(images, tmp_path)
    found = sorted(e["container"]["image"] for e in ir["deploymentSpec"]["executors"].values())
    assert found == [
        "chosen:2",
        "mine:1",
        "registry.example/torchx:7",
        "registry.example/torchx:7",
        "registry.example/torchx:7",
    ]


def test_public_parameters_are_documented_and_shown_by_kfp(tmp_path: Path) -> None:
    import docstring_parser

    from torchx.pipelines.kfp import adapter, torchx_launcher

    assert torchx_launcher.__doc__.startswith("Run a torchx component")
    for fn in (adapter.component_from_app, torchx_launcher.python_func):
        documented = {p.arg_name for p in docstring_parser.parse(fn.__doc__).params}
        assert set(inspect.signature(fn).parameters) <= documented, fn.__name__
    spec = torchx_launcher.component_spec
    assert spec.description.startswith("Run a torchx component")
    described = {**(spec.inputs or {}), **(spec.outputs or {})}
    assert all(s.description for s in described.values()), [
        n for n, s in described.items() if not s.description
    ]
    assert spec.outputs["model"].type == "system.Model@0.0.1"
    assert spec.outputs["metrics"].type == "system.Metrics@0.0.1"
