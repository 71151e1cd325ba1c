"""Idempotent submission for orchestrator adapters: remember which app a task submitted.

A retried task (same orchestrator run, task and key) finds the app its earlier try
submitted and waits on it instead of launching a second one. Records live under
``$TORCHX_HOME/<orchestrator>/``, shared by every worker process of the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

from torchx.specs.api import AppState
from torchx.util.paths import torchx_home


class AttachRecord:
    def __init__(self, orchestrator: str, key: str) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        self.path = torchx_home() / orchestrator / f"{digest}.json"
        self.key = key

    def load(self) -> Optional[str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data.get("app_handle") if data.get("key") == self.key else None

    def save(self, handle: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps({"key": self.key, "app_handle": handle}))
        os.replace(tmp, self.path)

    def reusable(self, runner: Any) -> Optional[str]:
        """The recorded app if it is still running or succeeded (a failed one is re-submitted)."""
        handle = self.load()
        if handle is None:
            return None
        status = runner.status(handle)
        if status is None or status.state in (AppState.FAILED, AppState.CANCELLED):
            return None
        return handle
