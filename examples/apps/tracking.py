"""How the reference stages report to torchx's tracker.

Lineage follows the data through ``torchx.trackers.record_output`` / ``record_input``
(a ``_torchx_lineage.json`` marker in each output), so the graph datapreproc -> dataset
-> train -> model -> evaluate needs no wiring by the orchestrator. Outside a torchx job
nothing is recorded but the markers.
"""

from __future__ import annotations

import os
from typing import Any

from torchx.trackers import app_run_from_env, record_input, record_output

__all__ = ["is_rank0", "record_input", "record_output", "run"]


def run() -> Any:
    """The tracker run of this job (records nothing outside a torchx job)."""
    return app_run_from_env()


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"
