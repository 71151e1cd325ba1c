"""The test Docker engine (``scripts/docker_engine.sh``): a private dockerd with torchx's image
and a registry on loopback (``TORCHX_TEST_REGISTRY``).

``scripts/test.sh`` starts both and builds ``torchx.IMAGE`` from this tree before the tests,
and sets ``TORCHX_TEST_DOCKER=1``: then an engine that does not answer fails the tests that
need it instead of skipping them.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any, List

import pytest

import torchx

# a small image every engine of scripts/docker_engine.sh has (made from Debian's packages)
BASE_IMAGE = "local/debian:bookworm"


def engine_or_skip() -> Any:
    """A Docker SDK client of the test engine, after checking it has torchx's image."""
    required = os.environ.get("TORCHX_TEST_DOCKER") == "1"
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get(torchx.IMAGE)
        client.images.get(BASE_IMAGE)
    except Exception as e:  # no SDK, no engine, no image: the same for the tests
        if required:
            pytest.fail(f"the test Docker engine or its images are unavailable: {e}")
        pytest.skip(f"no Docker engine with {torchx.IMAGE} (scripts/docker_engine.sh): {e}")
    return client


def registry_or_skip() -> str:
    """``host:port`` of the test registry."""
    address = os.environ.get("TORCHX_TEST_REGISTRY", "")
    try:
        urllib.request.urlopen(f"http://{address}/v2/", timeout=5).close()
    except Exception as e:  # unset or not answering: the same for the tests
        if os.environ.get("TORCHX_TEST_DOCKER") == "1":
            pytest.fail(f"the test registry {address!r} is unavailable: {e}")
        pytest.skip(f"no test registry (scripts/docker_engine.sh): {e}")
    return address


def registry_tags(address: str, repo: str) -> List[str]:
    """The tags ``repo`` has in the registry (its HTTP API), [] for an unknown repo."""
    try:
        with urllib.request.urlopen(f"http://{address}/v2/{repo}/tags/list", timeout=10) as r:
            return list(json.load(r).get("tags") or [])
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise
