"""Distributed PyTorch through torchrun: ``dist.ddp`` (any CPU/GPU DDP job) and ``dist.spmd``.

Beyond upstream, ``dist.ddp`` passes ``--max_restarts`` (a failed worker restarts the
worker group instead of failing the job), sets rendezvous timeouts (so a lone elastic
agent does not wait out torch's 30 s last call), and sets
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, without which restarted gloo worker groups
often fail in ``init_process_group`` on torch 2.x.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torchx
import torchx.specs as specs
from torchx.components.structured_arg import StructuredJArgument, StructuredNameArgument
from torchx.specs.api import DEFAULT_RDZV_PORT
from torchx.specs.names import role_name_from

# The env ``dist.ddp --debug`` sets (upstream's name; its own tests read it).
_TORCH_DEBUG_FLAGS: Dict[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "NCCL_DESYNC_DEBUG": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}


class _noquote(str):
    """A command part that must reach bash unquoted (the rank-0 host expansion)."""


def _join(cmd: List[str]) -> str:
    return " ".join(c if isinstance(c, _noquote) else shlex.quote(c) for c in cmd)


def _merge_rdzv_conf(user: Optional[str], defaults: Dict[str, str]) -> str:
    conf = dict(defaults)
    for pair in filter(None, (user or "").split(",")):
        k, _, v = pair.partition("=")
        conf[k.strip()] = v.strip()
    return ",".join(f"{k}={v}" for k, v in conf.items())


def ddp(
    *script_args: str,
    script: Optional[str] = None,
    m: Optional[str] = None,
    image: str = torchx.IMAGE,
    name: str = "/",
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: Optional[int] = None,
    rdzv_backend: str = "c10d",
    rdzv_conf: Optional[str] = None,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    max_restarts: int = 0,
    rdzv_timeout: int = 300,
    rdzv_last_call_timeout: int = 3,
) -> specs.AppDef:
    """Distributed data parallel style application (one role, multi-replica), run with torchrun.

    Uses torchelastic's c10d rendezvous. ``-j`` is ``NPROC``, ``NNODESxNPROC``, or
    ``MIN:MAXxNPROC`` for an elastic job that runs with MIN to MAX nodes.

    Args:
        script_args: arguments to the main module
        script: script or binary to run within the image
        m: the python module path to run
        image: image (e.g. docker)
        name: job name override in the format ``{experimentname}/{runname}`` or
            ``{experimentname}/`` or ``/{runname}`` or ``{runname}``
        h: a registered named resource (if specified takes precedence over cpu, gpu, memMB)
        cpu: number of cpus per replica
        gpu: number of gpus per replica
        memMB: cpu memory in MB per replica
        j: [{min_nnodes}:]{nnodes}x{nproc_per_node}, for gpu hosts, nproc_per_node must not
            exceed num gpus
        env: environment varibles to be passed to the run (e.g. ENV1=v1,ENV2=v2,ENV3=v3)
        max_retries: the number of scheduler retries allowed
        rdzv_port: the port on rank0's host to use for hosting the c10d store used for
            rendezvous. Only takes effect when running multi-node. When running single node,
            this parameter is ignored and a random free port is chosen. Unset, schedulers
            whose nodes share this host (local_cwd, local_docker) pick a free port per job,
            the others use 29500.
        rdzv_backend: the rendezvous backend to use. Only takes effect when running multi-node.
        rdzv_conf: extra rendezvous settings KEY=VALUE,... (merged over the timeouts below)
        mounts: mounts to mount into the worker environment/container
            (ex. type=<bind/volume>,src=/host,dst=/job[,readonly]).
        debug: whether to run with preset debug flags enabled
        tee: tees the specified std stream(s) to console + file. 0: none, 1: stdout,
            2: stderr, 3: both
        max_restarts: worker-group restarts torchrun does after a worker fails
            (or a node leaves) before the job fails
        rdzv_timeout: seconds a node waits for the rendezvous to complete (join timeout)
        rdzv_last_call_timeout: seconds an elastic rendezvous waits for more nodes once MIN
            have joined
    """
    if bool(script) == bool(m):
        raise specs.InvalidArgumentError(
            "dist.ddp: give exactly one of --script FILE or --m MODULE"
        )
    min_nnodes, max_nnodes, nproc, nnodes_rep = parse_nnodes(j)
    if max_restarts < 0:
        raise specs.InvalidArgumentError(
            f"dist.ddp: --max_restarts must be >= 0, got {max_restarts}"
        )

    if max_nnodes == 1:
        rdzv_endpoint: str = "localhost:0"
    else:
        port = specs.macros.rdzv_port if rdzv_port is None else str(rdzv_port)
        rdzv_endpoint = _noquote(f"$${{{specs.macros.rank0_env}:=localhost}}:{port}")

    names = StructuredNameArgument.parse_from(name, m, script)
    role_env: Dict[str, str] = {
        "TORCHX_TRACKING_EXPERIMENT_NAME": names.experiment_name,
        "TORCHX_TRACKING_RUN_NAME": names.run_name,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    role_env.update(env or {})
    role_env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
    if debug:
        role_env.update(_TORCH_DEBUG_FLAGS)

    conf = _merge_rdzv_conf(
        rdzv_conf,
        {"join_timeout": str(rdzv_timeout), "last_call_timeout": str(rdzv_last_call_timeout)},
    )
    rdzv_conf_arg: str = conf
    if max_nnodes > 1 and rdzv_backend == "c10d" and "is_host=" not in conf:
        # Replica 0 hosts the rendezvous store (as the rank-0 host does across machines);
        # otherwise, with several nodes on one host, any agent may host it and losing
        # that node would take the rendezvous down with it.
        rdzv_conf_arg = _noquote(
            shlex.quote(conf) + f",is_host=$([ {specs.macros.replica_id} = 0 ] && echo 1 || echo 0)"
        )
    flags = {
        "--rdzv_backend": rdzv_backend,
        "--rdzv_conf": rdzv_conf_arg,
        "--rdzv_endpoint": rdzv_endpoint,
        "--rdzv_id": f"{specs.macros.app_id}",
        "--nnodes": nnodes_rep,
        "--nproc_per_node": str(nproc),
        "--max_restarts": str(max_restarts),
        "--tee": str(tee),
        "--role": "",
    }
    cmd = ["torchrun", *(part for flag in flags.items() for part in flag)]
    if rdzv_backend == "static":
        cmd += ["--node_rank", f"{specs.macros.replica_id}"]
    cmd += [script] if script else ["-m", str(m)]
    cmd += list(script_args)

    role_name = get_role_name(script, m)
    return specs.AppDef(
        name=names.run_name,
        roles=[
            specs.Role(
                name=role_name,
                image=image,
                min_replicas=min_nnodes,
                entrypoint="bash",
                num_replicas=max_nnodes,
                resource=specs.resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h),
                args=["-c", _join(cmd)],
                env=role_env,
                port_map={"c10d": DEFAULT_RDZV_PORT if rdzv_port is None else rdzv_port},
                max_retries=max_retries,
                mounts=specs.parse_mounts(mounts) if mounts else [],
            )
        ],
    )


def spmd(
    *args: str,
    script: Optional[str] = None,
    m: Optional[str] = None,
    image: str = torchx.IMAGE,
    name: str = "/",
    h: str = "gpu.small",
    j: str = "1x1",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
) -> specs.AppDef:
    """SPMD (single program, multiple data) application on GPU hosts; \
``-j N`` uses all GPUs of ``-h``.

    Args:
        args: the arguments to the main module or script
        script: script or binary to run within the image
        m: the python module path to run
        image: the base docker image of the workspace
        name: {experimentname}/{runname} or {experimentname}/ or /{runname} or {runname}
        h: the type of host to run on (e.g. aws_p4d.24xlarge); must be a registered named resource
        j: {nnodes}x{nproc_per_node}; with -j {nnodes}, nproc_per_node is the number of GPUs of -h
        env: environment variables to be passed to the run (e.g. ENV1=v1,ENV2=v2,ENV3=v3)
        max_retries: the number of scheduler retries allowed
        mounts: (for docker based runs only) mounts to mount into the worker environment/container
        debug: whether to run with preset debug flags enabled
    """
    return ddp(
        *args,
        script=script,
        m=m,
        image=image,
        name=name,
        h=h,
        j=str(StructuredJArgument.parse_from(h, j)),
        env=env,
        max_retries=max_retries,
        mounts=mounts,
        debug=debug,
    )


def get_role_name(script: Optional[str], m: Optional[str]) -> str:
    """The role name ``dist.ddp`` uses: the script's stem, else the module's last part,
    made a valid role name (``"my dir/my script.py"`` -> ``my_script``, as upstream runs it).
    """
    if script:
        return role_name_from(Path(script).stem)
    if m:
        return role_name_from(m.rpartition(".")[2])
    raise ValueError("failed to compute role_name: give script or m")


def parse_nnodes(j: str) -> Tuple[int, int, int, str]:
    """``-j`` as ``(min_nnodes, max_nnodes, nproc_per_node, nnodes_rep)``: ``"1:2x4"`` ->
    ``(1, 2, 4, "1:2")``; a bad ``-j`` raises :class:`torchx.specs.InvalidArgumentError`."""
    parsed = StructuredJArgument.parse(j)
    return parsed.min_nnodes, parsed.max_nnodes, parsed.nproc_per_node, parsed.nnodes_rep
