"""The secrets a pipeline stage handles, for every adapter: what they mask in what they show
(log lines, artifacts, outputs; a ``MaskedLog``) and register with the orchestrator's own
masker (Airflow's). What is secret is decided by ``torchx.specs.secrets`` alone."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Union

from torchx.runner.api import Runner
from torchx.specs.errors import backend_errors
from torchx.specs.secrets import Masker, env_secrets, mask_args, url_secrets

logger = logging.getLogger(__name__)


def stage_secrets(
    runner: Runner,
    handle: Optional[str] = None,
    component_args: Union[List[str], Dict[str, Any], None] = None,
    env: Mapping[str, str] = os.environ,
) -> List[str]:
    """The secret values of a stage: its component's secret arguments, its trackers'
    URL credentials, the adapter process's secret env (MLflow's credentials, which torchx
    hands the job) and, given its ``handle``, the app's own secret env."""
    found: List[str] = []
    if component_args is not None:
        mask_args(component_args, found)
    for config in runner.trackers().values():
        found += url_secrets(config or "")
    found += env_secrets(env)
    if handle is not None:
        try:
            app = runner.describe(handle)
        except backend_errors() as e:  # masking what it can is never worth failing a stage
            logger.warning("could not read the env of %s to mask it: %s", handle, e)
            app = None
        for role in app.roles if app is not None else []:
            found += env_secrets(role.env)
    return [v for v in found if v]


class MaskedLog(logging.LoggerAdapter):
    """An orchestrator's logger whose records are masked (the formatted message)."""

    def __init__(self, log: Union[logging.Logger, logging.LoggerAdapter], masker: Masker) -> None:
        super().__init__(log, {})
        self.masker = masker

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if self.isEnabledFor(level):
            text = str(msg) % args if args else str(msg)
            self.logger.log(level, self.masker.mask(text), **kwargs)
