"""Dir workspaces: the workspace is copied into a job directory and the role runs there.

``.torchxignore`` at the workspace root says what to leave out (``.dockerignore`` rules).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, List, Mapping

from torchx.specs import CfgVal, Role
from torchx.util.paths import torchx_home
from torchx.workspace.api import (
    DISABLE_HINT,
    TORCHX_IGNORE,
    WORKSPACE_DIR,
    WorkspaceError,
    WorkspaceMixin,
    open_workspace,
    workspace_files,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
from torchx.workspace.api import workspace_dir as workspace_dir  # its upstream-facing home


class JobDirExistsError(WorkspaceError, FileExistsError):
    """``job_dir`` already exists, so the workspace cannot be copied into a fresh one."""


def copy_workspace(workspace: str, target: str, ignore_name: str = TORCHX_IGNORE) -> List[str]:
    """Copy what ``ignore_name`` lets through into ``target``, modes and symlinks kept;
    returns the copied paths, relative to ``target``."""
    fs, path = open_workspace(workspace)
    skip = None
    if _is_local(fs):
        inside = os.path.relpath(os.path.realpath(target), os.path.realpath(path))
        if inside != "." and not inside.startswith(".."):
            skip = inside.replace(os.sep, "/")  # the target is inside the workspace
    copied: List[str] = []
    for rel, info in workspace_files(fs, path, ignore_name, skip):
        dst = os.path.join(target, *rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if info.get("islink") and info.get("destination"):
            os.symlink(str(info["destination"]), dst)
        else:
            with fs.open(info["name"], "rb") as src, open(dst, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            mode = info.get("mode")
            if isinstance(mode, int):
                os.chmod(dst, stat.S_IMODE(mode))
        copied.append(rel)
    return copied


def _is_local(fs: AbstractFileSystem) -> bool:
    protocol = fs.protocol
    return "file" in (protocol if isinstance(protocol, (tuple, list)) else (protocol,))


class TmpDirWorkspaceMixin(WorkspaceMixin[None]):
    """Copies the workspace into a new temporary directory and makes it the role's image."""

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        import tempfile  # when a copy is made (tempfile loads random: ~2 ms per CLI start)

        job_dir = tempfile.mkdtemp(prefix="torchx_workspace")
        copy_workspace(workspace, job_dir)
        role.image = job_dir


class DirWorkspaceMixin(WorkspaceMixin[None]):
    """Copies the workspace into the ``job_dir`` run option and makes it the role's image."""

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        job_dir = cfg.get("job_dir")
        if job_dir is None:
            return
        if not isinstance(job_dir, str):
            raise WorkspaceError(f"job_dir must be a path, got {job_dir!r}")
        open_workspace(workspace)  # a bad workspace fails before job_dir is created
        try:
            os.makedirs(job_dir)
        except FileExistsError:
            raise JobDirExistsError(
                f"job_dir {job_dir} already exists; the workspace is copied into a new"
                f" directory: give a job_dir that does not exist, or {DISABLE_HINT}"
            ) from None
        copy_workspace(workspace, job_dir)
        role.image = job_dir


class LocalDirWorkspaceMixin(WorkspaceMixin[None]):
    """Runs the role in a copy of the workspace, unless the workspace is the current dir."""

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        fs, path = open_workspace(workspace)
        if _is_local(fs) and os.path.realpath(path) == os.path.realpath(os.getcwd()):
            return  # the job already runs here
        parent = torchx_home() / "workspaces"
        parent.mkdir(parents=True, exist_ok=True)
        import tempfile

        job_dir = tempfile.mkdtemp(prefix=f"{role.name}-", dir=parent)
        copy_workspace(workspace, job_dir)
        role.image = job_dir
        role.metadata[WORKSPACE_DIR] = job_dir
