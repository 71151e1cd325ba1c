"""Every public name issues 16 and 26 list imports from the module upstream TorchX 0.7.0 has
it in (the whole surface is measured by ``scripts/upstream_names.py``).

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
    "torchx.specs.api": "to_dict is_started AppStatus._format_error_message",
    "torchx.specs.builders": "BindMount VolumeMount DeviceMount MountType parse_mounts parse_args"
    " get_argparse_param_type decode_optional is_bool get_fn_docstring"
    " TorchXArgumentHelpFormatter",
    "torchx.specs.file_linter": "validate get_fn_docstring TorchXArgumentHelpFormatter"
    " LinterMessage",
    "torchx.specs.finder": "ComponentsFinder ModuleComponentsFinder CustomComponentsFinder"
    " validate read_conf_file module_relname is_package is_namespace_package _load_components"
    " logger",
    "torchx.specs.named_resources_aws": f"{_AWS} instance_type_from_resource",
    "torchx.runner.api": "get_component materialize_appdef get_configured_trackers get_configs"
    " get_config get_scheduler_factories NONE",
    "torchx.runner.events": "TorchxEvent SourceType record log_event get_logging_handler",
    "torchx.runner.events.api": "TorchxEvent SourceType",
    "torchx.runner.events.handlers": "get_logging_handler",
    "torchx.runtime.tracking": "FsspecResultTracker ResultTracker",
    "torchx.runtime.tracking.api": "FsspecResultTracker ResultTracker KeyType ResultType",
    "torchx.runner.config": "get_scheduler_factories DEFAULT_CONFIG_DIRS CONFIG_PREFIX_DELIM"
    " apply dump load",
    "torchx.schedulers.api": "WorkspaceMixin",
    "torchx.schedulers.local_scheduler": "LocalOpts ImageProvider CWDImageProvider"
    " LocalDirectoryImageProvider STDOUT_LOG STDERR_LOG COMBINED_LOG LocalScheduler.close"
    " LocalScheduler.auto_set_CUDA_VISIBLE_DEVICES LogIterator SignalException make_unique"
    " _join_PATH PopenProtocol AppId AppName RoleName NA ENV_CUDA_VISIBLE_DEVICES PopenRequest",
    "torchx.schedulers.kubernetes_scheduler": "role_to_pod app_to_resource pod_labels"
    " LABEL_VERSION LABEL_APP_NAME LABEL_ROLE_INDEX LABEL_ROLE_NAME LABEL_REPLICA_ID"
    " LABEL_KUBE_APP_NAME LABEL_ORGANIZATION LABEL_UNIQUE_NAME LABEL_INSTANCE_TYPE"
    " ANNOTATION_ISTIO_SIDECAR RESERVED_MILLICPU RESERVED_MEMMB RETRY_POLICIES JOB_STATE"
    " TASK_STATE sanitize_for_serialization",
    "torchx.schedulers.aws_batch_scheduler": "resource_requirements_from_resource"
    " resource_from_resource_requirements TAG_TORCHX_VER TAG_TORCHX_APPNAME TAG_TORCHX_USER"
    " to_millis_since_epoch to_datetime DEFAULT_ROLE_NAME ResourceType.from_str",
    "torchx.schedulers.devices": "DEVICES get_device_mounts to_devicemounts"
    " efa_to_devicemounts neuron_to_devicemounts",
    "torchx.schedulers.streams": "Tee",
    "torchx.schedulers.slurm_scheduler": "SlurmOpts SBATCH_JOB_OPTIONS SBATCH_GROUP_OPTIONS"
    " SlurmReplicaRequest.from_role SlurmReplicaRequest.materialize",
    "torchx.components.dist": "parse_nnodes get_role_name _TORCH_DEBUG_FLAGS",
    "torchx.components.structured_arg": "StructuredJArgument.nnodes",
    "torchx.distributed": "local_rank local_cuda_device local_device rank world_size is_rank0"
    " is_local_rank0 init_pg on_rank0_first on_local_rank0_first Backend",
    "torchx.util.cuda": "has_cuda_devices",
    "torchx.util.datetime": "get_past_epoch_time",
    "torchx.util.shlex": "join",
    "torchx.util.strings": "normalize_str",
    "torchx.util.io": "read_conf_file COMPONENTS_DIR get_abspath",
    "torchx.util.modules": "load_module",
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


def test_upstream_helpers_behave_as_upstreams(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The added helpers do what upstream's do (real files, real torch)."""
    from torchx.runtime.tracking import FsspecResultTracker
    from torchx.schedulers.aws_batch_scheduler import (
        resource_from_resource_requirements,
        resource_requirements_from_resource,
        to_millis_since_epoch,
    )
    from torchx.schedulers.devices import get_device_mounts
    from torchx.schedulers.local_scheduler import _join_PATH
    from torchx.specs import Resource
    from torchx.util.modules import load_module
    from torchx.util.shlex import join
    from torchx.util.strings import normalize_str

    tracker = FsspecResultTracker(str(tmp_path / "t"))
    tracker[3] = {"loss": 0.5, "tag": "x"}
    assert FsspecResultTracker(str(tmp_path / "t"))[3] == {"loss": 0.5, "tag": "x"}
    assert tracker["missing"] == {}
    assert (tmp_path / "t" / "3").is_file()  # upstream's layout: <base>/<key>

    res = Resource(cpu=4, gpu=1, memMB=2048)
    assert resource_from_resource_requirements(resource_requirements_from_resource(res)) == res
    import datetime as dt

    ts = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert to_millis_since_epoch(ts) == 1704067200000

    mounts = get_device_mounts({"vpc.amazonaws.com/efa": 2})
    assert [m.src_path for m in mounts] == ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]
    assert _join_PATH("/a:", None, "", ":/b") == "/a:/b"
    assert join(["a b", "c"]) == "'a b' c"
    assert normalize_str("-My_App.1") == "myapp1"
    assert load_module("os.path:join") is __import__("os").path.join
    assert load_module("no_such_module_xyz") is None


def test_distributed_helpers_in_a_plain_process() -> None:
    """``torchx.distributed`` without torchrun: one rank, gloo, no MASTER_* env written."""
    import os
    import subprocess
    import sys

    code = (
        "import os, torchx.distributed as d, torch.distributed as dist\n"
        "assert (d.rank(), d.world_size(), d.local_rank(), d.is_rank0()) == (0, 1, 0, True)\n"
        "dev = d.init_pg('gloo')\n"
        "with d.on_rank0_first():\n"
        "    print('group', dist.get_world_size(), dev, 'MASTER_ADDR' in os.environ)\n"
        "dist.destroy_process_group()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "TORCHELASTIC"))}
    env.pop("LOCAL_RANK", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "group 1 cpu False"


def test_a_scheduler_registered_under_another_name_runs_under_that_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Upstream's Runner names the handle after the key it was given (here ``local_dir``),
    and a relative entrypoint in the image directory runs (searched last on PATH)."""
    import os

    from torchx.runner import Runner
    from torchx.schedulers.local_scheduler import LocalDirectoryImageProvider, create_scheduler
    from torchx.specs import AppDef, AppState, Role, resource

    script = tmp_path / "touch.sh"
    script.write_text('#!/bin/sh\ntouch "$1"\n')
    os.chmod(script, 0o755)
    with Runner(
        "s",
        scheduler_factories={"local_dir": create_scheduler},
        scheduler_params={"image_provider_class": LocalDirectoryImageProvider},
    ) as runner:
        app = AppDef(
            "t",
            roles=[
                Role(
                    "touch",
                    image=str(tmp_path),
                    entrypoint="touch.sh",
                    args=[str(tmp_path / "done")],
                    resource=resource(cpu=1),
                )
            ],
        )
        handle = runner.run(app, scheduler="local_dir")
        assert handle.startswith("local_dir://s/")
        status = runner.wait(handle, wait_interval=0.05)
        assert status is not None and status.state == AppState.SUCCEEDED
    assert (tmp_path / "done").exists()


def test_a_plugin_with_upstreams_validate_signature_is_called(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A scheduler written for 0.7.0 overrides ``_validate(self, app, scheduler)``."""
    from torchx.schedulers.api import Scheduler
    from torchx.specs import AppDef, AppDryRunInfo, Role, resource

    seen = []

    class Plugin(Scheduler):  # type: ignore[type-arg]
        def _validate(self, app: AppDef, scheduler: str) -> None:  # type: ignore[override]
            seen.append((app.name, scheduler))
            super()._validate(app, scheduler)

        def _submit_dryrun(self, app, cfg):  # type: ignore[no-untyped-def]
            return AppDryRunInfo({"app": app.name}, str)

        def schedule(self, dryrun_info):  # type: ignore[no-untyped-def]
            return "id"

        def describe(self, app_id):  # type: ignore[no-untyped-def]
            return None

        def _cancel_existing(self, app_id):  # type: ignore[no-untyped-def]
            pass

        def list(self):  # type: ignore[no-untyped-def]
            return []

    plugin = Plugin("plugin", "s")
    role = Role("r", image="i", entrypoint="e", resource=resource(cpu=1))
    plugin.submit_dryrun(AppDef("a", roles=[role]), {})
    assert seen == [("a", "plugin")]
    with pytest.raises(ValueError, match="No resource"):
        plugin._validate(AppDef("b", roles=[Role("r", image="i", entrypoint="e")]), "plugin")


def test_replaced_default_config_dirs_are_searched_in_order(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from torchx.runner import config

    for d, v in (("a", "from_a"), ("b", "from_b")):
        (tmp_path / d).mkdir()
        (tmp_path / d / ".torchxconfig").write_text(f"[local_cwd]\nlog_dir = {v}\n")
    monkeypatch.chdir(tmp_path / "b")
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    assert config.find_configs()[0] == str(tmp_path / "b" / ".torchxconfig")  # cwd first
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIRS", [str(tmp_path / "a"), str(tmp_path / "b")])
    assert config.find_configs() == [
        str(tmp_path / "a" / ".torchxconfig"),
        str(tmp_path / "b" / ".torchxconfig"),
    ]
    cfg: dict = {}
    config.apply("local_cwd", cfg)
    assert cfg["log_dir"] == "from_a"


def test_kubernetes_names_build_what_the_scheduler_builds() -> None:
    pytest.importorskip("kubernetes")
    from torchx.schedulers.kubernetes_scheduler import (
        LABEL_REPLICA_ID,
        LABEL_ROLE_NAME,
        RESERVED_MILLICPU,
        pod_labels,
        role_to_pod,
        sanitize_for_serialization,
    )
    from torchx.specs import AppDef, Role, resource

    role = Role(
        "trainer",
        image="img",
        entrypoint="python",
        args=["t.py"],
        resource=resource(cpu=2, memMB=4096),
    )
    pod = role_to_pod("trainer-0", role, service_account="sa")
    doc = sanitize_for_serialization(pod)
    assert isinstance(doc, dict)
    container = doc["spec"]["containers"][0]
    assert container["command"] == ["python", "t.py"] and container["image"] == "img"
    assert doc["spec"]["serviceAccountName"] == "sa"
    assert container["resources"]["limits"]["cpu"] == "2000m"
    assert container["resources"]["requests"]["cpu"] == f"{2000 - RESERVED_MILLICPU}m"
    labels = pod_labels(AppDef("app", roles=[role]), 0, role, 3, "app-xyz")
    assert labels[LABEL_ROLE_NAME] == "trainer" and labels[LABEL_REPLICA_ID] == "3"
