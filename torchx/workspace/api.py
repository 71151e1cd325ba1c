"""The workspace contract: what a scheduler mixes in to run the user's local code.

The Runner applies a workspace to ``app.roles[0]`` only, and only for schedulers that mix
in ``WorkspaceMixin`` (``apply_workspace``).
"""

from __future__ import annotations

import abc
import logging
import os
import posixpath
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Optional, Protocol, TypeVar, Union

from torchx.specs import AppDef, CfgVal, Role, TorchXError, runopts

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

log: logging.Logger = logging.getLogger(__name__)

TORCHX_IGNORE = ".torchxignore"
DOCKER_IGNORE = ".dockerignore"
TORCHX_DOCKERFILE = "Dockerfile.torchx"
DISABLE_HINT = 'pass --workspace "" (workspace=None in Python) to run without the workspace'

T = TypeVar("T")
PackageType = TypeVar("PackageType")
WorkspaceConfigType = TypeVar("WorkspaceConfigType")


class WorkspaceError(TorchXError):
    """A workspace that cannot be applied (missing directory, no Docker daemon, ...)."""


@dataclass
class Workspace:
    """Local projects (keys) mapped to sub-directories (values) of the workspace root:
    ``{"~/src/app": "", "~/src/lib": "lib"}``; one project mapped to ``""`` is a plain path."""

    projects: dict[str, str]

    def is_unmapped_single_project(self) -> bool:
        return len(self.projects) == 1 and not next(iter(self.projects.values()))

    @staticmethod
    def from_str(workspace: str) -> Workspace:
        """A path (single project) or a YAML mapping ``{src: dst}`` (null means root)."""
        import yaml

        parsed = yaml.safe_load(workspace)
        if isinstance(parsed, str):
            return Workspace({parsed: ""})
        if not isinstance(parsed, dict):
            raise WorkspaceError(
                f"workspace {workspace!r} is neither a path nor a mapping of project to sub-dir"
            )
        return Workspace({str(k): "" if v is None else str(v) for k, v in parsed.items()})

    def __str__(self) -> str:
        if self.is_unmapped_single_project():
            return next(iter(self.projects))
        return ";".join(src if not dst else f"{src}:{dst}" for src, dst in self.projects.items())


@dataclass
class PkgInfo(Generic[PackageType]):
    """Deprecated upstream helper (kept for imports); emits a ``FutureWarning``."""

    img: str
    lazy_overrides: dict[str, Any]
    metadata: PackageType

    def __post_init__(self) -> None:
        _deprecated(type(self).__name__)


@dataclass
class WorkspaceBuilder(Generic[PackageType, WorkspaceConfigType]):
    """Deprecated upstream helper (kept for imports); emits a ``FutureWarning``."""

    cfg: WorkspaceConfigType

    def __post_init__(self) -> None:
        _deprecated(type(self).__name__)

    @abc.abstractmethod
    def build_workspace(self, sync: bool = True) -> PkgInfo[PackageType]: ...


def _deprecated(name: str) -> None:
    warnings.warn(
        f"{name} is deprecated and will be removed; fork it if your project depends on it",
        FutureWarning,
        stacklevel=3,
    )


class ImageBuild(Protocol):
    """An image build a scheduler planned for a workspace (printed as what it is)."""

    @property
    def files(self) -> Sequence[str]:
        """What went into the image."""


class WorkspaceMixin(abc.ABC, Generic[T]):
    """Mixed into a scheduler that can put a local workspace in front of a role's image; ``T``
    is what ``dryrun_push_images`` hands to ``push_images``."""

    def workspace_opts(self) -> runopts:
        """Run options the workspace needs (added to the scheduler's ``run_opts``)."""
        return runopts()

    def workspace_build(self, image: str) -> Optional[ImageBuild]:
        """The image build behind ``image`` planned by this scheduler (None: none)."""
        return None

    def build_workspace_and_update_role2(
        self, role: Role, workspace: Union[Workspace, str], cfg: Mapping[str, CfgVal]
    ) -> None:
        """A multi-project workspace is first assembled in a temporary directory."""
        if isinstance(workspace, Workspace) and not workspace.is_unmapped_single_project():
            import tempfile

            with tempfile.TemporaryDirectory(prefix="torchx_workspace_") as root:
                _assemble(workspace, root)
                self.build_workspace_and_update_role(role, root, cfg)
            return
        self.build_workspace_and_update_role(role, str(workspace), cfg)

    @abc.abstractmethod
    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        """Build ``workspace`` on top of ``role.image`` and point the role (its image) at it."""

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> T:
        """Rewrite local images in ``app`` to where ``push_images`` will put them."""
        raise NotImplementedError("dryrun_push_images is not implemented")

    def push_images(self, images_to_push: T) -> None:
        """Push what ``dryrun_push_images`` planned; called before the job is submitted."""
        raise NotImplementedError("push_images is not implemented")


def _assemble(workspace: Workspace, root: str) -> None:
    import shutil

    for src, dst in workspace.projects.items():
        source = Path(src).expanduser()
        target = Path(root) / dst
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif source.is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            raise WorkspaceError(f"workspace project {src!r} does not exist; {DISABLE_HINT}")


def open_workspace(workspace: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem and root path of ``workspace``; it must be an existing directory."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(workspace)
    if not isinstance(path, str) or not fs.isdir(path):
        raise WorkspaceError(f"workspace {workspace!r} is not a directory; {DISABLE_HINT}")
    return fs, path


def _walk(
    fs: AbstractFileSystem, path: str, ignore_name: str, skip: Optional[str] = None
) -> Iterator[tuple[str, str, list[str], dict[str, Mapping[str, Any]]]]:
    """``(dir, reldir, dirs, files)`` for every directory read, in sorted order; a symlink to
    a directory is a file (copied as a link), and ``skip`` (a copy's target) is left out."""
    from torchx.workspace.ignore import IgnoreRules

    ignore_path = posixpath.join(path, ignore_name)
    text = fs.cat_file(ignore_path).decode() if fs.isfile(ignore_path) else ""
    rules = IgnoreRules(text, source=ignore_name)
    stack: list[tuple[str, str]] = [(path, "")]
    while stack:
        current, rel = stack.pop()
        for dirpath, dirs, files in fs.walk(current, detail=True, maxdepth=1):
            entries: dict[str, Mapping[str, Any]] = dict(files)
            subdirs: list[str] = []
            for name, info in sorted(dirs.items()):
                if info.get("islink"):
                    entries[name] = info
                elif posixpath.join(rel, name) == skip:
                    continue
                elif not rules.skip_dir(posixpath.join(rel, name)):
                    subdirs.append(name)
            kept = {
                name: entries[name]
                for name in sorted(entries)
                if (not rel and name == TORCHX_DOCKERFILE)
                or not rules.excluded(posixpath.join(rel, name))
            }
            yield dirpath, rel, subdirs, kept
            for name in reversed(subdirs):
                stack.append((posixpath.join(dirpath, name), posixpath.join(rel, name)))
            break  # maxdepth=1: only the first tuple is this directory


def walk_workspace(
    fs: AbstractFileSystem, path: str, ignore_name: str = TORCHX_IGNORE
) -> Iterable[tuple[str, Iterable[str], Mapping[str, Mapping[str, object]]]]:
    """``fs.walk`` leaving out what ``ignore_name`` excludes (never ``Dockerfile.torchx``)."""
    for dirpath, _, dirs, files in _walk(fs, path, ignore_name):
        yield dirpath, dirs, files


def workspace_files(
    fs: AbstractFileSystem, path: str, ignore_name: str, skip: Optional[str] = None
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(relpath, info)`` of every file the ignore file lets through, in sorted order
    (leaving out the directory ``skip``, relative to ``path``).
    """
    for _, rel, _, files in _walk(fs, path, ignore_name, skip):
        for name, info in files.items():
            yield posixpath.join(rel, name), info


@dataclass
class WorkspaceBuild:
    """What ``apply_workspace`` did to ``roles[0]`` (printed by ``torchx run --dryrun``)."""

    workspace: str
    role: str
    old_image: str
    image: str
    files: list[str] = field(default_factory=list)
    detail: str = ""

    def __str__(self) -> str:
        head = f"workspace {self.workspace} -> role {self.role}: {self.old_image} -> {self.image}"
        detail = [self.detail] if self.detail else []
        files = [f"{len(self.files)} file(s):", *(f"  {f}" for f in self.files)]
        return "\n".join([head, *detail, *files])


def apply_workspace(
    scheduler: object,
    app: AppDef,
    workspace: Optional[Union[Workspace, str]],
    cfg: Mapping[str, CfgVal],
) -> Optional[WorkspaceBuild]:
    """Build ``workspace`` into ``app.roles[0]`` if ``scheduler`` is a ``WorkspaceMixin``
    (upstream's ``Runner.dryrun`` step); None when there is nothing to build."""
    if not workspace or not isinstance(scheduler, WorkspaceMixin) or not app.roles:
        return None
    run_opts = getattr(scheduler, "run_opts", None)  # a mixin on a Scheduler, or alone
    backend = str(getattr(scheduler, "backend", ""))
    resolved = run_opts().resolve(cfg, backend) if callable(run_opts) else dict(cfg)
    role = app.roles[0]
    old_image = role.image
    log.info("Checking for changes in workspace `%s`...", workspace)
    log.info('To disable workspaces pass: --workspace="" from CLI or workspace=None in Python.')
    scheduler.build_workspace_and_update_role2(role, workspace, resolved)
    if role.image != old_image:
        log.info(
            "Built new image `%s` based on original image `%s` and changes in workspace `%s`"
            " for role[0]=%s.",
            role.image,
            old_image,
            workspace,
            role.name,
        )
    else:
        log.info("Reusing original image `%s` for role[0]=%s.", old_image, role.name)
    files, detail = _describe(scheduler, role, old_image)
    return WorkspaceBuild(str(workspace), role.name, old_image, role.image, files, detail)


# Role.metadata key: the directory a local role runs in (its copy of the workspace).
WORKSPACE_DIR = "torchx.workspace.dir"


def workspace_dir(role: Role) -> Optional[str]:
    """The directory ``role`` must run in, if a local dir workspace was applied to it."""
    value = role.metadata.get(WORKSPACE_DIR)
    return str(value) if value else None


def _describe(scheduler: WorkspaceMixin[Any], role: Role, old_image: str) -> tuple[list[str], str]:
    """The files that went into the role's new image or job dir, and where they are."""
    if role.image == old_image:
        return [], "nothing built: the role runs its image (or directory) as is"
    build = scheduler.workspace_build(role.image)
    if build is not None:
        return list(build.files), str(build)
    target = workspace_dir(role) or role.image
    if target and os.path.isdir(target):
        root = Path(target)
        files = sorted(
            p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()
        )
        return files, f"copied into {target}"
    return [], ""
