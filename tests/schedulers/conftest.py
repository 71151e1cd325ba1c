"""The cloud stand-ins' fixtures: one server per test module, emptied for each test."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from .kmock_server import KMockServer
    from .moto_server import MotoBatchServer


@pytest.fixture(scope="module")
def kmock_server() -> Iterator[KMockServer]:
    from .kmock_server import KMockServer

    with KMockServer() as server:
        yield server


@pytest.fixture()
def srv(kmock_server: KMockServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KMockServer:
    return kmock_server.fresh(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoBatchServer]:
    from .moto_server import MotoBatchServer

    with MotoBatchServer() as server:
        yield server


@pytest.fixture()
def moto(
    moto_server: MotoBatchServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> MotoBatchServer:
    """Only the test module's ``QUEUE`` exists; boto3 (and the CLI) point here."""
    return moto_server.fresh(tmp_path, monkeypatch, request.module.QUEUE)
