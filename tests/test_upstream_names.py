"""Every public name issue 16 lists imports from the module upstream TorchX 0.7.0 has it in.

Code written against upstream does ``from torchx.x.y import Name``; each case here is one
such import (or attribute of an imported class), so a missing name fails on its own line.
"""

from __future__ import annotations

import importlib
from typing import List, Tuple

import pytest

_AWS = (
    "aws_c5_18xlarge aws_g4dn_12xlarge aws_g4dn_16xlarge aws_g4dn_2xlarge aws_g4dn_4xlarge"
    " aws_g4dn_8xlarge aws_g4dn_metal aws_g4dn_xlarge aws_g5_12xlarge aws_g5_16xlarge"
    " aws_g5_24xlarge aws_g5_2xlarge aws_g5_48xlarge aws_g5_4xlarge aws_g5_8xlarge aws_g5_xlarge"
    " aws_g6e_12xlarge aws_g6e_16xlarge aws_g6e_24xlarge aws_g6e_2xlarge aws_g6e_48xlarge"
    " aws_g6e_4xlarge aws_g6e_8xlarge aws_g6e_xlarge aws_inf2_24xlarge aws_inf2_48xlarge"
    " aws_inf2_8xlarge aws_inf2_xlarge aws_m5_2xlarge aws_p3_16xlarge aws_p3_2xlarge"
    " aws_p3_8xlarge aws_p3dn_24xlarge aws_p4d_24xlarge aws_p4de_24xlarge aws_p5_48xlarge"
    " aws_p5en_48xlarge aws_t3_medium aws_trn1_2xlarge aws_trn1_32xlarge"
)

NAMES = {
    "torchx.specs": "materialize_appdef load_group GiB AWS_NAMED_RESOURCES GENERIC_NAMED_RESOURCES"
    " RetryPolicy.HOT_SPARE",
    "torchx.specs.api": "to_dict",
    "torchx.specs.builders": "BindMount VolumeMount DeviceMount MountType parse_mounts parse_args"
    " get_argparse_param_type decode_optional is_bool get_fn_docstring"
    " TorchXArgumentHelpFormatter",
    "torchx.specs.file_linter": "validate get_fn_docstring TorchXArgumentHelpFormatter"
    " LinterMessage",
    "torchx.specs.finder": "ComponentsFinder ModuleComponentsFinder CustomComponentsFinder"
    " validate read_conf_file module_relname is_package is_namespace_package",
    "torchx.specs.named_resources_aws": f"{_AWS} instance_type_from_resource",
    "torchx.runner.api": "get_component materialize_appdef get_configured_trackers",
    "torchx.runner.config": "get_scheduler_factories DEFAULT_CONFIG_DIRS CONFIG_PREFIX_DELIM"
    " apply dump load",
    "torchx.schedulers.api": "WorkspaceMixin",
    "torchx.schedulers.local_scheduler": "LocalOpts ImageProvider CWDImageProvider"
    " LocalDirectoryImageProvider STDOUT_LOG STDERR_LOG COMBINED_LOG LocalScheduler.close"
    " LocalScheduler.auto_set_CUDA_VISIBLE_DEVICES",
    "torchx.schedulers.slurm_scheduler": "SlurmOpts SBATCH_JOB_OPTIONS SBATCH_GROUP_OPTIONS"
    " SlurmReplicaRequest.from_role SlurmReplicaRequest.materialize",
    "torchx.components.dist": "parse_nnodes get_role_name",
    "torchx.components.utils": "booth touch copy binary",
    "torchx.util.types": "decode_from_string is_bool is_primitive decode_optional"
    " get_argparse_param_type none_throws",
    "torchx.workspace": "WorkspaceMixin walk_workspace",
    "torchx.workspace.api": "WorkspaceMixin walk_workspace",
    "torchx.workspace.dir_workspace": "DirWorkspaceMixin TmpDirWorkspaceMixin",
    "torchx.workspace.docker_workspace": "DockerWorkspaceMixin TORCHX_DOCKERFILE",
}


def _cases() -> List[Tuple[str, str]]:
    return [(module, name) for module, names in NAMES.items() for name in names.split()]


@pytest.mark.parametrize("module,name", _cases(), ids=[f"{m}:{n}" for m, n in _cases()])
def test_name_imports_from_its_upstream_module(module: str, name: str) -> None:
    obj = importlib.import_module(module)
    for part in name.split("."):
        assert hasattr(obj, part), f"from {module} import {name}: no {part!r}"
        obj = getattr(obj, part)


def test_star_import_of_specs_gives_upstreams_names() -> None:
    namespace: dict = {}
    exec("from torchx.specs import *", namespace)
    for name in ("AppDef", "materialize_appdef", "named_resources", "parse_mounts", "runopts"):
        assert name in namespace
