"""kubernetes: the job's owner (``Runner.run(owner=...)``) is stored with the job, as an
annotation (a label value cannot hold JSON), and read back by ``describe`` and so by
``torchx reap`` (kmock: the official client against an in-memory API server)."""

from __future__ import annotations

import pytest

from torchx import specs
from torchx.pipelines.owner import Owner, owner_of
from torchx.pipelines.reap import Orchestrators, find_candidates
from torchx.runner import get_runner
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, OWNER, idempotency_token
from torchx.schedulers.kubernetes.manifests import ANNOTATION_OWNER, LABEL_IDEMPOTENCY_TOKEN

from .kmock_server import BATCH_JOBS, VOLCANO_JOBS, KMockServer, echo_app

# spaces, '|', quotes and a non-ASCII character: what a label could never hold
OWNER_DOC = '{"kind":"kfp","run":"run 1 | ü","task":"train \\"a\\""}'


@pytest.mark.parametrize(
    ("cfg", "resource", "suffix"),
    [({"queue": "q"}, VOLCANO_JOBS, ""), ({"job_type": "indexed"}, BATCH_JOBS, "-echo")],
)
def test_owner_is_an_annotation_and_describe_returns_it(
    srv: KMockServer, cfg: dict, resource: str, suffix: str
) -> None:
    runner = get_runner()
    handle = runner.run(echo_app(), "kubernetes", cfg, idempotency_key="k", owner=OWNER_DOC)
    ns, name = specs.parse_app_handle(handle).app_id.split(":")
    job = srv.get(resource, ns, name + suffix)
    assert job is not None
    assert job["metadata"]["annotations"][ANNOTATION_OWNER] == OWNER_DOC
    assert job["metadata"]["labels"][LABEL_IDEMPOTENCY_TOKEN] == idempotency_token("k")

    app = get_runner().describe(handle)  # another process: from the cluster alone
    assert app is not None
    assert app.metadata == {OWNER: OWNER_DOC, IDEMPOTENCY_TOKEN: idempotency_token("k")}


def test_reap_sees_the_owner_and_an_unowned_job_has_none(srv: KMockServer) -> None:
    runner = get_runner()
    owned = runner.run(echo_app(), "kubernetes", {"queue": "q"}, owner=OWNER_DOC)
    plain = runner.run(echo_app(), "kubernetes", {"queue": "q"})
    app = get_runner().describe(plain)  # a fresh runner asks the cluster, not its cache
    assert app is not None and app.metadata == {}

    found = find_candidates(get_runner(), ["kubernetes"], Orchestrators())
    assert [c.handle for c in found] == [owned]
    assert found[0].owner == owner_of({OWNER: OWNER_DOC})
    assert found[0].owner == Owner("kfp", {"run": "run 1 | ü", "task": 'train "a"'})
