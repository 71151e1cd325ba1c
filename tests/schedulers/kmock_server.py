"""A kmock Kubernetes API emulator on a background thread, for the sync ``kubernetes`` client.

kmock is asyncio-based; the official client is synchronous (urllib3). This helper runs
the emulator's event loop on its own thread, listens on 127.0.0.1, and offers:

- ``url`` / ``write_kubeconfig(path)``: where the client (or the CLI) connects;
- ``objects`` access made thread-safe through ``call`` (mutations run on the loop thread);
- ``list_selectors``: the label selectors the client sent (kmock does not apply them);
- pod logs: ``set_log(ns, pod, text)`` serves ``GET .../pods/{pod}/log``; with
  ``follow=true`` the text is streamed in small chunks that split lines, so the
  client's line re-assembly is exercised (upstream torchx#983).

There are no controllers: tests set job/pod status themselves (``patch``/``put``), or
with the emulated controllers ``volcano_pods`` / ``indexed_pods``. The test apps and
checks the kubernetes test modules share are at the end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, TypeVar

import pytest
import yaml

from torchx import specs
from torchx.components.dist import ddp

R = TypeVar("R")

VOLCANO_JOBS = "batch.volcano.sh/v1alpha1/jobs"
BATCH_JOBS = "batch/v1/jobs"
PODS = "v1/pods"
SERVICES = "v1/services"
COMMANDS = "bus.volcano.sh/v1alpha1/commands"  # Volcano's job commands (AbortJob, ...)
CONFIG_MAPS = "v1/configmaps"  # keyed submissions' claims

_LOG_PATH = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/]+)/log")


class KMockServer:
    """Start with ``start()``, stop with ``stop()`` (or use as a context manager)."""

    def __init__(self, chunk_size: int = 7, chunk_delay: float = 0.01) -> None:
        self.chunk_size = chunk_size
        self.chunk_delay = chunk_delay
        self.logs: Dict[Tuple[str, str], str] = {}
        self.log_requests: list[Dict[str, str]] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._ready = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self._error: Optional[BaseException] = None
        self.km: Any = None
        self.url = ""

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> KMockServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("kmock did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"kmock failed to start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        import kmock

        # no access lines: one logged as pytest closes a test's captured stream is an error
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as km, kmock.Server(km) as server:
            self.km = km
            for res in (VOLCANO_JOBS, BATCH_JOBS, PODS, SERVICES, COMMANDS, CONFIG_MAPS):
                km.resources[res] = {}
            km.resources[VOLCANO_JOBS].kind = "Job"
            km.resources[BATCH_JOBS].kind = "Job"
            km.resources[PODS].kind = "Pod"
            km.resources[SERVICES].kind = "Service"
            km.resources[COMMANDS].kind = "Command"
            km.resources[CONFIG_MAPS].kind = "ConfigMap"
            km["get", _LOG_PATH] << self._serve_log
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def fresh(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KMockServer:
        """Per test: no objects, logs or log requests; the client (and CLI) point here."""
        self.call(self.km.objects.clear)
        self.logs.clear()
        self.log_requests.clear()
        monkeypatch.setenv("KUBECONFIG", str(self.write_kubeconfig(tmp_path / "kubeconfig")))
        monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
        monkeypatch.chdir(tmp_path)
        return self

    # ------------------------------------------------------------------ state access

    def call(self, fn: Callable[[], R]) -> R:
        """Run ``fn`` on the emulator's loop thread (objects are not thread-safe)."""
        assert self._loop is not None
        fut: concurrent.futures.Future[R] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return fut.result(timeout=30)

    def get(self, resource: str, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        """The current object (a plain dict), or None if absent or deleted."""

        def read() -> Optional[Dict[str, Any]]:
            try:
                obj = self.km.objects[resource, namespace, name]
            except KeyError:
                return None
            return None if obj.deleted else _plain(obj.raw)

        return self.call(read)

    def names(self, resource: str, namespace: Optional[str] = None) -> list[str]:
        """Names of the live objects of ``resource``."""

        def read() -> list[str]:
            import kmock

            res = kmock.resource(resource)
            return [
                name
                for (r, ns, name), obj in self.km.objects.items()
                if r == res and (namespace is None or ns == namespace) and not obj.deleted
            ]

        return self.call(read)

    def put(self, resource: str, namespace: str, name: str, body: Dict[str, Any]) -> None:
        """Create or replace an object, as a controller (kubelet, Volcano) would."""
        body = dict(body)
        body.setdefault("metadata", {})
        body["metadata"] = {**body["metadata"], "name": name, "namespace": namespace}
        self.call(lambda: self.km.objects.__setitem__((resource, namespace, name), body))

    def patch(self, resource: str, namespace: str, name: str, changes: Dict[str, Any]) -> None:
        """Merge ``changes`` into the object (e.g. a status update)."""
        self.call(lambda: self.km.objects[resource, namespace, name].patch(changes))

    def request_count(self) -> int:
        """How many requests the emulator has served (a mark for ``list_selectors``)."""
        return self.call(lambda: len(list(self.km)))

    def list_selectors(self, since: int = 0) -> list[Tuple[str, str]]:
        """(path, labelSelector) of the GET requests served after mark ``since``.

        kmock itself ignores label selectors, so tests check what the client asked for.
        """

        def read() -> list[Tuple[str, str]]:
            return [
                (r.url.path, str(r.params.get("labelSelector", "")))
                for r in list(self.km)[since:]
                if str(r.method.value).upper() == "GET"
            ]

        return self.call(read)

    def set_log(self, namespace: str, pod: str, text: str) -> None:
        self.logs[(namespace, pod)] = text

    # ------------------------------------------------------------------ logs

    async def _serve_log(self, request: Any) -> Any:
        m = _LOG_PATH.fullmatch(request.url.path)
        assert m is not None
        key = (m["ns"], m["pod"])
        self.log_requests.append(dict(request.params))
        if key not in self.logs:
            import kmock

            raise kmock.KubernetesObjectNotFoundError()
        text = self.logs[key]
        if str(request.params.get("follow", "")).lower() != "true":
            return text.encode()
        return self._chunks(text)

    async def _chunks(self, text: str) -> AsyncIterator[bytes]:
        data = text.encode()
        for i in range(0, len(data), self.chunk_size):
            yield data[i : i + self.chunk_size]
            await asyncio.sleep(self.chunk_delay)

    # ------------------------------------------------------------------ client config

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig whose current context points at this emulator."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "kmock", "user": {"token": "kmock"}}],
            "contexts": [
                {
                    "name": "kmock",
                    "context": {"cluster": "kmock", "user": "kmock", "namespace": namespace},
                }
            ],
            "current-context": "kmock",
        }
        path.write_text(yaml.safe_dump(cfg))
        return path


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# ------------------------------------------------------------------ test apps and checks


def ddp_app() -> specs.AppDef:
    """The reference training stage: elastic DDP on 1 to 2 nodes x 2 processes."""
    return ddp(
        "--epochs",
        "1",
        script="train.py",
        j="1:2x2",
        cpu=2,
        gpu=2,
        memMB=4096,
        name="trainer",
        max_retries=2,
    )


def echo_app(name: str = "echo", n: int = 1, **kw: Any) -> specs.AppDef:
    role = specs.Role(
        name="echo",
        image="alpine",
        entrypoint="echo",
        args=["hi", specs.macros.replica_id],
        num_replicas=n,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
        **kw,
    )
    return specs.AppDef(name=name, roles=[role])


def accepts(manifest: Dict[str, Any], model: str) -> Any:
    """The official client parses the manifest into ``model`` and writes back the same data."""
    from kubernetes.client import ApiClient

    class _Resp:
        data = json.dumps(manifest)

    api = ApiClient()
    obj = api.deserialize(_Resp(), model)
    assert api.sanitize_for_serialization(obj) == manifest
    return obj


def container(template: Dict[str, Any]) -> Dict[str, Any]:
    return template["spec"]["containers"][0]


def container_env(template: Dict[str, Any]) -> Dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(template)["env"]}


def app_status(runner: Any, handle: str) -> specs.AppStatus:
    status = runner.status(handle)
    assert status is not None, handle
    return status


# ------------------------------------------------------------------ emulated controllers


def volcano_pods(srv: KMockServer, app_id: str, phases: List[str], **status: Any) -> None:
    """Play Volcano + kubelet: one pod per task, named ``{job}-{task}-0``, in ``phases``."""
    ns, name = app_id.split(":")
    job = srv.get(VOLCANO_JOBS, ns, name)
    assert job is not None
    for task, phase in zip(job["spec"]["tasks"], phases, strict=False):
        tmpl = task["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**tmpl["metadata"], "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {
                **tmpl["spec"],
                "nodeName": "node-1",
                "hostname": f"{name}-{task['name']}-0",
                "subdomain": name,
            },
            "status": {"phase": phase, **status},
        }
        srv.put(PODS, ns, f"{name}-{task['name']}-0", pod)


def indexed_pods(
    srv: KMockServer, ns: str, job_name: str, phases: List[str], **status: Any
) -> List[str]:
    """Play the Job controller + kubelet for an Indexed Job."""
    job = srv.get(BATCH_JOBS, ns, job_name)
    assert job is not None
    tmpl = job["spec"]["template"]
    names = []
    for i, phase in enumerate(phases):
        meta = {
            "labels": {
                **tmpl["metadata"]["labels"],
                "batch.kubernetes.io/job-completion-index": str(i),
                "job-name": job_name,
            },
            "annotations": {
                **tmpl["metadata"]["annotations"],
                "batch.kubernetes.io/job-completion-index": str(i),
            },
            "creationTimestamp": "2025-01-01T00:00:00Z",
        }
        pod_name = f"{job_name}-{i}-abcde"
        srv.put(
            PODS,
            ns,
            pod_name,
            {
                "metadata": meta,
                "spec": {**tmpl["spec"], "nodeName": f"node-{i}"},
                "status": {"phase": phase, **status},
            },
        )
        names.append(pod_name)
    return names


def replica_states(status: specs.AppStatus) -> Dict[str, List[specs.AppState]]:
    return {r.role: [x.state for x in r.replicas] for r in status.roles}
