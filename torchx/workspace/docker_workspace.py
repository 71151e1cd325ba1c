"""Docker workspaces: the workspace is built into a new image on top of the role's image.

Unlike upstream, nothing talks to Docker during the dry run: the build context (a
reproducible tar) is made and hashed, the role's image becomes ``sha256:<digest>``, and
``push_images`` builds and pushes it at schedule time.
"""

from __future__ import annotations

import hashlib
import io
import logging
import stat
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, TextIO, Tuple

from torchx.specs import AppDef, CfgVal, Role, runopts
from torchx.workspace.api import (
    DISABLE_HINT,
    DOCKER_IGNORE,
    TORCHX_DOCKERFILE,
    WorkspaceError,
    WorkspaceMixin,
    open_workspace,
    workspace_files,
)

if TYPE_CHECKING:
    from docker import DockerClient

log: logging.Logger = logging.getLogger(__name__)

DEFAULT_DOCKERFILE = b"ARG IMAGE\nFROM $IMAGE\nCOPY . .\n"
HASH_PREFIX = "sha256:"
LARGE_CONTEXT = 256 << 20  # bytes; a bigger build context gets a warning

ImagesToPush = Dict[str, Tuple[str, str]]  # local image -> (repo, tag)


class DockerUnavailableError(WorkspaceError):
    """The workspace image must be built but no Docker daemon (or SDK) is reachable."""


class MissingImageRepoError(WorkspaceError, KeyError):
    """A workspace image needs ``image_repo`` to be pushed (a ``KeyError`` as upstream)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class WorkspaceBuildError(WorkspaceError):
    """``docker build`` of the workspace image failed."""


class ImagePushError(WorkspaceError, RuntimeError):
    """``docker push`` of the workspace image failed."""


@dataclass
class DockerWorkspaceBuild:
    """A workspace image planned at dry-run time and built by ``push_images``."""

    image: str  # sha256:<digest>, the role's image until dryrun_push_images rewrites it
    base_image: str
    workspace: str
    files: List[str]  # tar members, Dockerfile.torchx first
    context: IO[bytes] = field(repr=False)
    quiet: bool = False

    def __str__(self) -> str:
        return (
            f"docker build context: {TORCHX_DOCKERFILE} + {len(self.files) - 1} file(s)"
            f" from {self.workspace}, build args IMAGE={self.base_image}"
            f" WORKSPACE={self.workspace}"
        )


def build_context(workspace: str) -> Tuple[IO[bytes], List[str]]:
    """The tar build context of ``workspace`` (at offset 0) and its members."""
    fs, path = open_workspace(workspace)
    entries = list(workspace_files(fs, path, DOCKER_IGNORE))
    f = tempfile.TemporaryFile(prefix="torchx-context", suffix=".tar")
    names: List[str] = []
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
        if not any(rel == TORCHX_DOCKERFILE for rel, _ in entries):
            dockerfile = _tarinfo(TORCHX_DOCKERFILE, len(DEFAULT_DOCKERFILE), 0o644)
            tf.addfile(dockerfile, io.BytesIO(DEFAULT_DOCKERFILE))
            names.append(TORCHX_DOCKERFILE)
        entries.sort(key=lambda e: (e[0] != TORCHX_DOCKERFILE, e[0]))
        for rel, info in entries:
            mode = info.get("mode")
            perm = stat.S_IMODE(mode) if isinstance(mode, int) else 0o644
            if info.get("islink") and info.get("destination"):
                ti = _tarinfo(rel, 0, perm)
                ti.type = tarfile.SYMTYPE
                ti.linkname = str(info["destination"])
                tf.addfile(ti)
            else:
                with fs.open(info["name"], "rb") as src:
                    tf.addfile(_tarinfo(rel, int(info["size"]), perm), src)
            names.append(rel)
    size = f.seek(0, io.SEEK_END)
    if size > LARGE_CONTEXT:
        log.warning(
            "the build context of workspace %s is %d MB: leave out data, checkpoints and"
            " virtualenvs with a .dockerignore",
            workspace,
            size >> 20,
        )
    f.seek(0)
    return f, names


def _tarinfo(name: str, size: int, mode: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mode = mode
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def _digest(context: IO[bytes], buildargs: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    while chunk := context.read(1 << 20):
        h.update(chunk)
    context.seek(0)
    for key in sorted(buildargs):
        h.update(f"\0{key}={buildargs[key]}".encode())
    return h.hexdigest()


class DockerWorkspaceMixin(WorkspaceMixin[ImagesToPush]):
    """Builds the workspace into an image on top of the role's image and pushes it."""

    LABEL_VERSION: str = "torchx.pytorch.org/version"

    def __init__(
        self, *args: Any, docker_client: Optional[DockerClient] = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.__docker_client = docker_client
        self._workspace_builds: Dict[str, DockerWorkspaceBuild] = {}

    @property
    def _docker_client(self) -> DockerClient:
        client = self.__docker_client
        if client is None:
            client = connect_docker(f"build the workspace image; or {DISABLE_HINT}")
            self.__docker_client = client
        return client

    def workspace_build(self, image: str) -> Optional[DockerWorkspaceBuild]:
        """The planned build behind ``image`` (``sha256:<digest>`` or ``image_repo:<digest>``)."""
        return self._workspace_builds.get(HASH_PREFIX + image.rpartition(":")[2])

    def workspace_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "image_repo",
            type_=str,
            help="(remote jobs) the image repository to push workspace images to;"
            " you need push access. Ex: example.com/your/container",
        )
        opts.add(
            "quiet",
            type_=bool,
            default=False,
            help="whether to suppress verbose output for image building. Defaults to ``False``.",
        )
        return opts

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        """Plan an image of ``workspace`` on ``role.image`` (``push_images`` builds it)."""
        context, files = build_context(workspace)
        base = role.image
        digest = _digest(context, {"IMAGE": base, "WORKSPACE": workspace})
        build = DockerWorkspaceBuild(
            HASH_PREFIX + digest, base, workspace, files, context, bool(cfg.get("quiet"))
        )
        old = self._workspace_builds.get(build.image)
        if old is not None:
            old.context.close()
        self._workspace_builds[build.image] = build
        log.info("%s -> %s", build, build.image)
        role.image = build.image

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> ImagesToPush:
        """Point every local (``sha256:``) image at ``image_repo:<hash>``; returns what to push."""
        image_repo = cfg.get("image_repo")
        to_push: ImagesToPush = {}
        for role in app.roles:
            if not role.image.startswith(HASH_PREFIX):
                continue
            if not image_repo or not isinstance(image_repo, str):
                raise MissingImageRepoError(
                    f"role {role.name!r}: the workspace image {role.image[:19]}... must be"
                    " pushed to a repository the cluster can pull from: pass"
                    f" -cfg image_repo=REPO (e.g. ghcr.io/you/app), or {DISABLE_HINT}"
                )
            tag = role.image[len(HASH_PREFIX) :]
            to_push[role.image] = (image_repo, tag)
            role.image = f"{image_repo}:{tag}"
        return to_push

    def push_images(self, images_to_push: ImagesToPush) -> None:
        """Build the planned images, tag them ``repo:tag`` and push them."""
        if not images_to_push:
            return
        client = self._docker_client
        for local, (repo, tag) in images_to_push.items():
            image_id = self._build(client, local)
            log.info("pushing image %s:%s...", repo, tag)
            client.images.get(image_id).tag(repo, tag=tag)
            _check_push(client.images.push(repo, tag=tag, stream=True, decode=True), repo)

    def _build(self, client: DockerClient, image: str) -> str:
        """The real image id of ``image``, building it first if it is a planned build."""
        build = self._workspace_builds.get(image)
        if build is None:
            return image
        base = self._build(client, build.base_image)
        ensure_image(client, base)
        log.info("Building workspace docker image (this may take a while)...")
        import torchx

        build.context.seek(0)
        events = client.api.build(
            fileobj=build.context,
            custom_context=True,
            dockerfile=TORCHX_DOCKERFILE,
            buildargs={"IMAGE": base, "WORKSPACE": build.workspace},
            pull=False,
            rm=True,
            decode=True,
            labels={self.LABEL_VERSION: torchx.__version__},
        )
        image_id = None
        for event in events:
            message = str(event.get("stream") or "").strip()
            if message and not build.quiet:
                log.info(message)
            if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
                image_id = str(event["aux"]["ID"])
            if event.get("error"):
                raise WorkspaceBuildError(
                    f"docker build of workspace {build.workspace} failed: {event['error']}".strip()
                )
        if not image_id:
            raise WorkspaceBuildError(
                f"docker build of workspace {build.workspace} reported no image id"
            )
        return image_id


def connect_docker(purpose: str = "run containers") -> DockerClient:
    """A client of the Docker engine ``DOCKER_HOST`` names (else the default socket);
    ``DockerUnavailableError`` saying what it was needed ``purpose`` for if none answers."""
    try:
        import docker
    except ImportError:
        raise DockerUnavailableError(
            f"the Docker SDK is not installed (pip install 'torchx[docker]'): needed to {purpose}"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, OSError) as e:  # no engine, or none that answers
        reason = " ".join(str(e).split())
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        raise DockerUnavailableError(
            f"cannot reach a Docker engine ({reason}): start Docker or set DOCKER_HOST;"
            f" needed to {purpose}"
        ) from None
    return client


class MissingImageError(WorkspaceError):
    """An image is neither on the Docker engine nor pullable."""


def ensure_image(client: DockerClient, image: str) -> None:
    """Use ``image`` as the engine has it, else pull it (a build's base, a job's image);
    ``MissingImageError`` in one line if neither works."""
    from docker.errors import DockerException, ImageNotFound

    try:
        client.images.get(image)
        return
    except ImageNotFound:
        pass
    log.info("Pulling container image: %s (this may take a while)", image)
    try:
        client.images.pull(image)
    except (DockerException, OSError) as e:  # no registry, no access, no such tag: the same
        reason = " ".join(str(e).split())[:200]
        raise MissingImageError(
            f"image {image} is not on the Docker engine and cannot be pulled ({reason}):"
            " build it (torchx's image: the Dockerfile in torchx's repository) or pass --image"
        ) from None


def _check_push(events: Iterable[Dict[str, Any]], repo: str) -> None:
    last: Dict[str, str] = {}
    for event in events:
        if "error" in event:
            raise ImagePushError(
                f"failed to push docker image: {event['error']}; check `docker login` for {repo}"
            )
        status = event.get("status")
        key = str(event.get("id") or "")
        if status and last.get(key) != status:
            last[key] = str(status)
            log.info("docker push %s%s", f"{key}: " if key else "", status)


def print_push_events(events: Iterable[Dict[str, str]], stream: TextIO = sys.stderr) -> None:
    """Render ``docker push`` progress events, one line per layer updated in place."""
    header = "\033[34mdocker push \033[0m"
    layers: List[str] = []
    for event in events:
        if "error" in event:
            raise ImagePushError(f"failed to push docker image: {event['error']}")
        status = event.get("status")
        if not status:
            continue
        layer = event.get("id")
        if not layer:
            stream.write(f"{header}{status}\n")
            continue
        line = f"{header}{layer}: {status} {event.get('progress', '')}"
        if layer not in layers:
            layers.append(layer)
            stream.write(line + "\n")
        else:
            up = len(layers) - layers.index(layer)
            stream.write(f"\033[{up}F\033[2K{line}\033[{up}E")
