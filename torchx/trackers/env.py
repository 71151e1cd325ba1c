"""The environment names by which a job knows its trackers and its run: apart from
``torchx.trackers.api``, so a submit without trackers never loads more than this."""

from __future__ import annotations

import re
from typing import Dict, Mapping, Optional

ENV_TORCHX_TRACKERS = "TORCHX_TRACKERS"
ENV_TORCHX_PARENT_RUN_ID = "TORCHX_PARENT_RUN_ID"
ENV_TORCHX_JOB_ID = "TORCHX_JOB_ID"
UNDEFINED_RUN_ID = "<UNDEFINED>"


def tracker_config_env_var_name(entrypoint_name: str) -> str:
    """``TORCHX_TRACKER_<NAME>_CONFIG`` (characters invalid in env names become ``_``)."""
    return f"TORCHX_TRACKER_{re.sub(r'[^A-Za-z0-9]', '_', entrypoint_name).upper()}_CONFIG"


def tracker_env(trackers: Mapping[str, Optional[str]]) -> Dict[str, str]:
    """The env that sends a job's ``torchx.trackers`` calls to ``trackers``."""
    env = {ENV_TORCHX_TRACKERS: ",".join(trackers)} if trackers else {}
    for name, config in trackers.items():
        if config:
            env[tracker_config_env_var_name(name)] = config
    return env
