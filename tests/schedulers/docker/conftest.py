from __future__ import annotations

from typing import Any, Iterator

import pytest

from ...docker_engine import engine_or_skip


@pytest.fixture(scope="module")
def docker_client() -> Iterator[Any]:
    client = engine_or_skip()
    yield client
    client.close()
