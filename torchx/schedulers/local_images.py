"""Image providers of the local scheduler (upstream's API): what a role's ``image`` means
on this host, that is which directory a replica runs in and how its entrypoint is found.

``local_cwd`` uses ``CWDImageProvider`` (the image is ignored: run in the current
directory). ``LocalDirectoryImageProvider`` treats the image as a directory to run in.
Re-exported by ``torchx.schedulers.local_scheduler``, where upstream defines them.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, TypedDict

from torchx.schedulers.api import InvalidAppError
from torchx.specs.api import Role


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
