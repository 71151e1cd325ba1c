"""Utility components: echo, touch, sh, python, binary, copy, booth."""

from __future__ import annotations

import os
import shlex
from typing import Dict, List, Optional

import torchx
import torchx.specs as specs
from torchx.components.structured_arg import check_replicas


def _loglevel_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    out = dict(env or {})
    out.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
    return out


def echo(
    msg: str = "hello world", image: str = torchx.IMAGE, num_replicas: int = 1
) -> specs.AppDef:
    """Echos a message to stdout (calls echo)

    Args:
        msg: message to echo
        image: image to use
        num_replicas: number of replicas to run
    """
    check_replicas(num_replicas, "--num_replicas")
    return specs.AppDef(
        name="echo",
        roles=[
            specs.Role(
                name="echo",
                image=image,
                entrypoint="echo",
                args=[msg],
                num_replicas=num_replicas,
                resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
            )
        ],
    )


def touch(file: str, image: str = torchx.IMAGE) -> specs.AppDef:
    """Touches a file (calls touch).

    Args:
        file: file to create
        image: the image to use
    """
    return specs.AppDef(
        name="touch",
        roles=[
            specs.Role(
                name="touch",
                image=image,
                entrypoint="touch",
                args=[file],
                num_replicas=1,
                resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
            )
        ],
    )


def sh(
    *args: str,
    image: str = torchx.IMAGE,
    num_replicas: int = 1,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    mounts: Optional[List[str]] = None,
    entrypoint: Optional[str] = None,
) -> specs.AppDef:
    """Runs the provided command via sh (each argument shell-quoted, so $VAR is not expanded).

    Args:
        args: the command and its arguments
        image: image to use
        num_replicas: number of replicas to run
        cpu: number of cpus per replica
        gpu: number of gpus per replica
        memMB: cpu memory in MB per replica
        h: a registered named resource (if specified takes precedence over cpu, gpu, memMB)
        env: environment variables to be passed to the run (e.g. ENV1=v1,ENV2=v2)
        max_retries: the number of scheduler retries allowed
        mounts: mounts, e.g. type=bind,src=/host,dst=/job[,readonly]
        entrypoint: the entrypoint to use for the command (defaults to sh -c)
    """
    check_replicas(num_replicas, "--num_replicas")
    escaped = " ".join(shlex.quote(arg) for arg in args)
    if entrypoint is not None:
        role_entrypoint, role_args = entrypoint, list(args)
    else:
        role_entrypoint, role_args = "sh", ["-c", escaped]
    return specs.AppDef(
        name="sh",
        roles=[
            specs.Role(
                name="sh",
                image=image,
                entrypoint=role_entrypoint,
                args=role_args,
                num_replicas=num_replicas,
                resource=specs.resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h),
                env=_loglevel_env(env),
                max_retries=max_retries,
                mounts=specs.parse_mounts(mounts) if mounts else [],
            )
        ],
    )


def python(
    *args: str,
    m: Optional[str] = None,
    c: Optional[str] = None,
    script: Optional[str] = None,
    image: str = torchx.IMAGE,
    name: str = "torchx_utils_python",
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    h: Optional[str] = None,
    num_replicas: int = 1,
) -> specs.AppDef:
    """Runs ``python`` with the specified module, command or script on the specified
    image and host. Use ``--`` to separate component args and program args
    (e.g. ``torchx run utils.python --m foo.main -- --args to --main``).

    Args:
        args: arguments passed to the program in sys.argv[1:] (ignored with --c)
        m: run library module as a script
        c: program passed as string (may error if scheduler has a length limit on args)
        script: .py script to run
        image: image to run on
        name: name of the job
        cpu: number of cpus per replica
        gpu: number of gpus per replica
        memMB: cpu memory in MB per replica
        h: a registered named resource (if specified takes precedence over cpu, gpu, memMB)
        num_replicas: number of copies to run (each on its own container)
    """
    check_replicas(num_replicas, "--num_replicas")
    given = [x for x in (m, c, script) if x]
    if len(given) != 1:
        raise specs.InvalidArgumentError(
            "utils.python: give exactly one of --m MODULE, --c CODE or --script FILE"
        )
    if m:
        cmd = ["-m", m]
    elif c:
        cmd = ["-c", c]
    else:
        cmd = [str(script)]
    return specs.AppDef(
        name=name,
        roles=[
            specs.Role(
                name="python",
                image=image,
                entrypoint="python",
                num_replicas=num_replicas,
                resource=specs.resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h),
                args=[*cmd, *args],
                env={"HYDRA_MAIN_MODULE": m} if m else {},
            )
        ],
    )


def binary(
    *args: str,
    entrypoint: str,
    name: str = "torchx_utils_binary",
    num_replicas: int = 1,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    h: Optional[str] = None,
) -> specs.AppDef:
    """Runs the given binary (no image).

    Args:
        args: arguments passed to the program
        entrypoint: the binary to run
        name: name of the job
        num_replicas: number of copies to run
        cpu: number of cpus per replica
        gpu: number of gpus per replica
        memMB: cpu memory in MB per replica
        h: a registered named resource (if specified takes precedence over cpu, gpu, memMB)
    """
    check_replicas(num_replicas, "--num_replicas")
    return specs.AppDef(
        name=name,
        roles=[
            specs.Role(
                name="binary",
                image=specs.NONE,
                entrypoint=entrypoint,
                num_replicas=num_replicas,
                resource=specs.resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h),
                args=list(args),
            )
        ],
    )


def copy(src: str, dst: str, image: str = torchx.IMAGE) -> specs.AppDef:
    """Copies one file from src to dst; both may be any fsspec path or URL (s3://, memory://, ...).

    Args:
        src: the source path or URL
        dst: the destination path or URL
        image: the image that contains torchx
    """
    return specs.AppDef(
        name="torchx-utils-copy",
        roles=[
            specs.Role(
                name="torchx-utils-copy",
                image=image,
                entrypoint="python",
                args=["-m", "torchx.apps.utils.copy_main", "--src", src, "--dst", dst],
                resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
            )
        ],
    )


def booth(
    x1: float,
    x2: float,
    trial_idx: int = 0,
    tracker_base: str = "/tmp/torchx-util-booth",
    image: str = torchx.IMAGE,
) -> specs.AppDef:
    """Evaluates the booth function, ``f(x1, x2) = (x1 + 2*x2 - 7)^2 + (2*x1 + x2 - 5)^2``.

    The hyper-parameter optimization demo: the result is written under ``tracker_base``
    for trial ``trial_idx``.

    Args:
        x1: x1
        x2: x2
        trial_idx: ignore if not running hpo
        tracker_base: URI of the tracker's base output directory (e.g. s3://foo/bar)
        image: the image that contains the booth app
    """
    args = ["-m", "torchx.apps.utils.booth_main", "--x1", str(x1), "--x2", str(x2)]
    args += ["--trial_idx", str(trial_idx), "--tracker_base", tracker_base]
    return specs.AppDef(
        name="torchx-utils-booth",
        roles=[
            specs.Role(
                name="torchx-utils-booth",
                image=image,
                entrypoint="python",
                args=args,
                resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
            )
        ],
    )
