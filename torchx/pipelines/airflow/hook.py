"""``TorchXHook``: torchx's settings for every Airflow process from one Airflow Connection
(type ``torchx``, default id ``torchx_default``), so none depends on its environment; its
fields are in docs/deploying_airflow.md. Nothing here changes ``os.environ``.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Dict

from airflow.sdk import BaseHook

from torchx.pipelines.settings import TorchXSettings, Trackers, settings_from
from torchx.runner.api import Runner

DEFAULT_CONN_ID = "torchx_default"
CONN_TYPE = "torchx"


class TorchXHook(BaseHook):
    """torchx's settings from the Connection ``torchx_conn_id`` (extra: ``torchx_home``,
    ``cfg``, ``trackers``; login and password: the tracker's credentials)."""

    conn_name_attr = "torchx_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "TorchX"

    def __init__(self, torchx_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.torchx_conn_id = torchx_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> Dict[str, Any]:
        return {
            "hidden_fields": ["schema", "port", "host"],
            "relabeling": {"login": "Tracker username", "password": "Tracker password"},
            "placeholders": {
                "extra": json.dumps(
                    {
                        "torchx_home": "/shared/torchx",
                        "cfg": {"slurm": {"partition": "gpu"}},
                        "trackers": {"mlflow": "https://mlflow:5000"},
                    }
                )
            },
        }

    @functools.cached_property
    def settings(self) -> TorchXSettings:
        """The Connection's settings, read once; none (the environment decides) without it."""
        from airflow.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.torchx_conn_id)
        except AirflowNotFoundException:
            if self.torchx_conn_id != DEFAULT_CONN_ID:  # named on purpose: say it is missing
                raise
            return TorchXSettings()
        return settings_from(conn.extra_dejson, conn.login, conn.password)

    def runner(self, trackers: Trackers = None) -> Runner:
        """A Runner with the Connection's settings; ``trackers`` (an operator's) win."""
        return self.settings.runner(trackers)

    get_conn = runner  # BaseHook's name for what the hook connects to
