"""The README's "Your own pipeline" snippets are real code: each builds its pipeline."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

# a throwaway Airflow home unless the Airflow tests' conftest set one (it runs first)
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="torchx-readme-airflow-"))

README = Path(__file__).resolve().parent.parent / "README.md"


def _snippet(first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"README has no python block starting with {first_line!r}"
    return found[0]


def _run(first_line: str) -> Dict[str, Any]:
    scope: Dict[str, Any] = {"__name__": "readme_snippet"}
    exec(compile(_snippet(first_line), str(README), "exec", dont_inherit=True), scope)
    return scope


@pytest.mark.slow
def test_airflow_snippet_builds_a_three_stage_dag() -> None:
    from airflow.sdk import DAG

    dags = [v for v in _run("# Airflow").values() if isinstance(v, DAG)]
    assert len(dags) == 1
    dag = dags[0]
    assert [t.task_id for t in dag.topological_sort()] == ["prep", "train", "report"]
    assert dag.task_dict["train"].deferrable


@pytest.mark.slow
def test_kfp_snippet_compiles_with_the_train_task_resources(tmp_path: Path) -> None:
    from kfp import compiler

    out = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(_run("# KFP v2")["my_pipeline"], str(out))
    ir = yaml.safe_load(out.read_text())
    tasks = ir["root"]["dag"]["tasks"]["exit-handler-1"]
    inner = ir["components"][tasks["componentRef"]["name"]]["dag"]["tasks"]
    assert len(inner) == 3
    executors = ir["deploymentSpec"]["executors"]
    train = inner["torchx-launcher-2"]
    resources = executors[ir["components"][train["componentRef"]["name"]]["executorLabel"]][
        "container"
    ]["resources"]
    assert resources.get("cpuLimit") or resources.get("resourceCpuLimit"), resources


@pytest.mark.slow
def test_prefect_snippet_defines_a_flow() -> None:
    from prefect import Flow

    flow = _run("# Prefect 3")["my_pipeline"]
    assert isinstance(flow, Flow)
    assert [h.__name__ for h in flow.on_completion_hooks] == ["close_pipeline_run"]
