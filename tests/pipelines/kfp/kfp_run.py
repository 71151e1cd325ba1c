"""Run a compiled container component's command as KFP would, without a container.

KFP's own code (``kfp.local``'s executor-input and placeholder functions, as its
DockerRunner uses them) resolves the executor's command, args and env; the resolved
command then runs here as a subprocess. Only the container is missing: what reaches the
program (argv, env) is what a KFP pod would get.
"""

from __future__ import annotations

import subprocess
from typing import Any, Dict, List, Mapping, Tuple

import yaml


def resolve_executor(
    ir_path: str, task: str, arguments: Mapping[str, Any], root: str
) -> Tuple[List[str], Dict[str, str]]:
    """The command (placeholders resolved) and env of ``task`` in a compiled pipeline."""
    from google.protobuf import json_format
    from kfp.local import executor_input_utils, placeholder_utils, task_dispatcher
    from kfp.pipeline_spec import pipeline_spec_pb2

    ir = yaml.safe_load(open(ir_path))
    spec = ir["root"]["dag"]["tasks"][task]
    comp = json_format.ParseDict(
        ir["components"][spec["componentRef"]["name"]], pipeline_spec_pb2.ComponentSpec()
    )
    executor = json_format.ParseDict(
        ir["deploymentSpec"]["executors"][comp.executor_label],
        pipeline_spec_pb2.PipelineDeploymentConfig.ExecutorSpec(),
    )
    executor_input = executor_input_utils.construct_executor_input(
        component_spec=comp, arguments=dict(arguments), task_root=root, block_input_artifact=True
    )
    full = list(executor.container.command) + list(executor.container.args)
    command = placeholder_utils.replace_placeholders(
        full_command=full,
        executor_input_dict=executor_input_utils.executor_input_to_dict(executor_input, comp),
        pipeline_resource_name="p-1",
        task_resource_name=task,
        pipeline_root=root,
        unique_pipeline_id="job-42",
    )
    env = task_dispatcher._extract_container_env_vars(executor.container)
    return command, dict(env)


def run(command: List[str], env: Mapping[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        command, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout
