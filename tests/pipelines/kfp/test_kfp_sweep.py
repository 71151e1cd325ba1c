"""A sweep in KFP: ``dsl.ParallelFor`` over ``torchx_launcher``, compiled, and run with
kfp.local (SubprocessRunner): one app and one tracker run per iteration, each keyed by its
loop item, the handles fanned in with ``dsl.Collected``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

LRS = ["0.1", "0.01", "0.001"]

PIPELINE = f"""
from typing import List

from kfp import dsl

from torchx.pipelines.kfp.components import (
    close_pipeline_run, start_pipeline_run, torchx_launcher
)


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def distinct(handles: List[str]) -> int:
    print(f"DISTINCT {{len(set(handles))}}")
    return len(set(handles))


@dsl.pipeline(name="sweep")
def sweep() -> None:
    run = start_pipeline_run(pipeline_name="sweep", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    close = close_pipeline_run(pipeline_name="sweep", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    with dsl.ExitHandler(close):
        with dsl.ParallelFor({LRS!r}, parallelism=2) as lr:
            stage = torchx_launcher(
                component="utils.echo",
                component_args=["--msg", lr],
                key=lr,
                parent_run_id=run.output,
                job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
            )
        distinct(handles=dsl.Collected(stage.outputs["app_handle"]))
"""


def _env(tmp_path: Path) -> dict:
    env = dict(
        os.environ,
        TORCHX_HOME=str(tmp_path / "home"),
        TORCHX_TRACKERS="mlflow",
        TORCHX_TRACKER_MLFLOW_CONFIG=f"sqlite:///{tmp_path / 'mlflow.db'}",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("TORCHXCONFIG", None)
    return env


def _python(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    (tmp_path / "sweep_pipeline.py").write_text(PIPELINE)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def test_a_parallel_for_over_launchers_compiles_with_the_loop_item_as_key(
    tmp_path: Path,
) -> None:
    done = _python(
        tmp_path,
        f"""
        from kfp import compiler
        from sweep_pipeline import sweep
        compiler.Compiler().compile(sweep, {str(tmp_path / "sweep.yaml")!r})
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ir = yaml.safe_load((tmp_path / "sweep.yaml").read_text())
    handler = ir["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    loop = next(t for name, t in handler.items() if name.startswith("for-loop-"))
    assert loop["parameterIterator"]["items"]["raw"] == '["0.1", "0.01", "0.001"]'
    assert loop["iteratorPolicy"]["parallelismLimit"] == 2
    body = ir["components"][loop["componentRef"]["name"]]["dag"]["tasks"]
    key = body["torchx-launcher"]["inputs"]["parameters"]["key"]
    assert key["componentInputParameter"] == loop["parameterIterator"]["itemInput"]
    # the fan-in reads every iteration's handle
    assert handler["distinct"]["dependentTasks"] == [loop["taskInfo"]["name"]]


@pytest.mark.slow
def test_a_parallel_for_runs_one_app_and_one_tracker_run_per_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = _python(
        tmp_path,
        f"""
        import kfp.local
        from sweep_pipeline import sweep
        kfp.local.init(
            runner=kfp.local.SubprocessRunner(use_venv=False),
            pipeline_root={str(tmp_path / "root")!r},
        )
        sweep()
        """,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"DISTINCT {len(LRS)}" in out, out[-3000:]
    for lr in LRS:
        assert f"echo/0 {lr}\n" in out, out[-3000:]

    from torchx.runner import get_runner
    from torchx.trackers.api import build_trackers

    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    with get_runner(trackers={}) as runner:
        handles = sorted(a.app_handle for a in runner.list("local_cwd"))
    assert len(handles) == len(LRS)
    tracker = build_trackers({"mlflow": f"sqlite:///{tmp_path / 'mlflow.db'}"})[0]
    pipeline = [r for r in tracker.run_ids() if r.startswith("kfp://sweep/")]
    assert len(pipeline) == 1
    assert sorted(tracker.run_ids(parent_run_id=pipeline[0])) == handles
    names = sorted(
        tracker.client.get_run(tracker.mlflow_run_id(h)).info.run_name  # type: ignore[attr-defined]
        for h in handles
    )
    assert names == sorted(f"torchx-launcher[{lr}]" for lr in LRS)


def test_a_keyed_launcher_in_a_loop_without_key_is_refused_when_built(tmp_path: Path) -> None:
    """Every iteration has the same task name: without ``key`` they would share one app."""
    done = _python(
        tmp_path,
        """
        from kfp import compiler, dsl
        from torchx.pipelines.kfp.components import torchx_launcher

        @dsl.pipeline(name="unkeyed")
        def unkeyed() -> None:
            with dsl.ParallelFor(["a", "b"]) as msg:
                torchx_launcher(
                    component="utils.echo",
                    component_args=["--msg", msg],
                    job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                    task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
                )

        compiler.Compiler().compile(unkeyed, "unkeyed.yaml")
        """,
    )
    assert done.returncode != 0
    assert "torchx_launcher in a dsl.ParallelFor with task_name needs key=" in done.stderr
