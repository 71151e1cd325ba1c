"""Where a local replica runs: the image providers of upstream's ``local_scheduler`` (what
a role's ``image`` means on this host, where its entrypoint is found) and which GPUs it sees.
"""

from __future__ import annotations

import abc
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, TypedDict

from torchx.schedulers.api import InvalidAppError
from torchx.specs.api import AppDef, Role

logger = logging.getLogger(__name__)


class LocalOpts(TypedDict, total=False):
    """The run options of ``local_cwd`` (``-cfg``)."""

    log_dir: str
    prepend_cwd: Optional[bool]
    auto_set_cuda_visible_devices: Optional[bool]


@dataclass
class ReplicaParam:
    """How one replica is started: command, added env, log files, working directory."""

    args: List[str]
    env: Dict[str, str]
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    combined: Optional[str] = None
    cwd: Optional[str] = None
    error_file: str = ""


class ImageProvider(abc.ABC):
    """Turns a role's image into a directory on this host (nothing is downloaded here)."""

    def fetch_role(self, role: Role) -> str:
        """``fetch(role.image)``; override to also adjust the role."""
        return self.fetch(role.image)

    @abc.abstractmethod
    def fetch(self, image: str) -> str:
        """The image's root directory on this host ("" if there is none)."""

    def get_replica_param(
        self,
        img_root: str,
        role: Role,
        stdout: Optional[str] = None,
        stderr: Optional[str] = None,
        combined: Optional[str] = None,
    ) -> ReplicaParam:
        """How to start one replica of ``role`` (whose image was fetched to ``img_root``)."""
        return ReplicaParam(
            [self.get_entrypoint(img_root, role), *role.args],
            dict(role.env),
            stdout,
            stderr,
            combined,
            self.get_cwd(role.image),
        )

    def get_cwd(self, image: str) -> Optional[str]:
        """The working directory of the replicas (None: the launcher's)."""
        return None

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        """The program to run."""
        return os.path.join(img_root, role.entrypoint)


class LocalDirectoryImageProvider(ImageProvider):
    """The image is an existing directory; replicas run in it. A relative entrypoint is
    found there (or on ``PATH``), an absolute one is run as given."""

    def __init__(self, cfg: LocalOpts) -> None:
        pass

    def fetch(self, image: str) -> str:
        if not os.path.isdir(image):
            raise InvalidAppError(
                f"Invalid image name: {image}, does not exist or is not a directory"
            )
        return image

    def get_cwd(self, image: str) -> Optional[str]:
        return image

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        return role.entrypoint


class CWDImageProvider(ImageProvider):
    """The image is ignored: replicas run in the current working directory."""

    def __init__(self, cfg: LocalOpts) -> None:
        pass

    def fetch(self, image: str) -> str:
        return os.getcwd()

    def get_cwd(self, image: str) -> Optional[str]:
        return os.getcwd()

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        return role.entrypoint


ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def cuda_device_count() -> int:
    """GPUs on this host, from ``nvidia-smi -L`` (0 without it); torch is not imported."""
    import subprocess  # only asked for GPU roles; a dry run needs no subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.split("\n") if line])


def set_cuda_visible_devices(
    role_params: Dict[str, List[ReplicaParam]],
    app: AppDef,
    cfg: LocalOpts,
    device_count: Callable[[], int],
) -> None:
    """With ``auto_set_cuda_visible_devices``, give each replica of a GPU role its own
    ``CUDA_VISIBLE_DEVICES`` (consecutive ids, roles in order, e.g. 2 GPUs per replica:
    ``0,1`` then ``2,3``). All or nothing: if the host has fewer GPUs than the app
    asks for in total, none is set (with a warning)."""
    requested = sum(role.num_replicas * role.resource.gpu for role in app.roles)
    if requested <= 0:
        return
    if not cfg.get("auto_set_cuda_visible_devices"):
        logger.warning(
            "replicas that request GPUs run without CUDA_VISIBLE_DEVICES and may share"
            " devices; set -cfg auto_set_cuda_visible_devices=True to divide them"
        )
        return
    available = device_count()
    if requested > available:
        logger.warning(
            "cannot auto-set CUDA_VISIBLE_DEVICES: %d GPUs requested, %d available",
            requested,
            available,
        )
        return
    start = 0
    for role in app.roles:
        if role.resource.gpu <= 0:
            continue
        for replica in role_params[role.name]:
            end = start + role.resource.gpu
            replica.env[ENV_CUDA_VISIBLE_DEVICES] = ",".join(map(str, range(start, end)))
            start = end


def search_path(extra_paths: List[str]) -> str:
    """A replica's ``PATH``: this interpreter's bin directory first (so ``torchrun`` and
    ``python`` are the launcher's, venv activated or not), then ``extra_paths``, then the
    launcher's ``PATH``, without repeats."""
    parts = [os.path.dirname(sys.executable), *extra_paths, os.environ.get("PATH", "")]
    return os.pathsep.join(dict.fromkeys(p for p in os.pathsep.join(parts).split(os.pathsep) if p))


def _join_PATH(*paths: Optional[str]) -> str:
    """Join ``PATH`` parts, skipping empty ones and stray separators at their ends."""
    return os.pathsep.join(p.strip(os.pathsep) for p in paths if p)


def check_entrypoint(role: str, entry: str, path_env: str, cwd: str) -> None:
    """Refuse at submit an entrypoint that is neither on ``path_env`` nor in ``cwd``."""
    if shutil.which(entry, path=path_env) is None and not os.path.isfile(os.path.join(cwd, entry)):
        raise InvalidAppError(f"role {role!r}: entrypoint {entry!r} not found on PATH or in {cwd}")
