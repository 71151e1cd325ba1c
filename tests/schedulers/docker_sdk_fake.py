"""A stand-in for the Docker daemon behind the Docker SDK's ``DockerClient``.

This machine has no Docker engine; like kmock for Kubernetes and moto for AWS, this plays
the remote service so the schedulers' schedule-time path (build, tag, push, then submit)
runs end to end. It records what was asked (the uploaded build context's members, build
args, tags, pushes) and can refuse a push as a registry would.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

BUILT_ID = "sha256:" + "b" * 64


@dataclass
class Build:
    members: List[str]
    dockerfile: bytes
    buildargs: Dict[str, str]


@dataclass
class FakeDockerClient:
    """``api.build``, ``images.pull/get/push`` and ``Image.tag``, as the SDK calls them."""

    push_error: Optional[str] = None
    on_push: Optional[Callable[[], None]] = None  # runs when a push starts (to snapshot state)
    builds: List[Build] = field(default_factory=list)
    tags: List[Tuple[str, str, str]] = field(default_factory=list)  # (image id, repo, tag)
    pushes: List[Tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.api = _Api(self)
        self.images = _Images(self)


class _Api:
    def __init__(self, daemon: FakeDockerClient) -> None:
        self._daemon = daemon

    def build(self, fileobj: Any, dockerfile: str, buildargs: Dict[str, str], **_: Any) -> Any:
        with tarfile.open(fileobj=io.BytesIO(fileobj.read()), mode="r") as tf:
            members = [m.name for m in tf.getmembers()]
            df = tf.extractfile(dockerfile)
            assert df is not None, f"no {dockerfile} in the build context"
            self._daemon.builds.append(Build(members, df.read(), dict(buildargs)))
        return iter([{"stream": "Step 1/3 : ARG IMAGE\n"}, {"aux": {"ID": BUILT_ID}}])


class _Image:
    def __init__(self, daemon: FakeDockerClient, image_id: str) -> None:
        self._daemon = daemon
        self._id = image_id

    def tag(self, repo: str, tag: str) -> bool:
        self._daemon.tags.append((self._id, repo, tag))
        return True


class _Images:
    def __init__(self, daemon: FakeDockerClient) -> None:
        self._daemon = daemon

    def pull(self, image: str) -> None:
        """The base image is pulled before the build (any image exists here)."""

    def get(self, image_id: str) -> _Image:
        return _Image(self._daemon, image_id)

    def push(self, repo: str, tag: str, **_: Any) -> Iterator[Dict[str, Any]]:
        if self._daemon.on_push is not None:
            self._daemon.on_push()
        self._daemon.pushes.append((repo, tag))
        yield {"status": f"The push refers to repository [{repo}]"}
        if self._daemon.push_error:
            yield {"error": self._daemon.push_error}
            return
        yield {"id": "layer1", "status": "Pushed"}
