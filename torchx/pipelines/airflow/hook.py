"""``TorchXHook``: torchx's settings for every Airflow process, from one Airflow Connection.

A Connection of type ``torchx`` (default id ``torchx_default``) holds what each process that
touches a stage needs (worker, triggerer, the scheduler and api-server for the listener), so
none depends on its environment. Its extra (JSON)::

    {"torchx_home": "/shared/torchx",                  # torchx's state (local_cwd, Slurm)
     "cfg": {"slurm": {"partition": "gpu"}},           # run-option defaults per scheduler
     "trackers": {"mlflow": "https://mlflow:5000"}}    # where jobs report

and its login and password are the tracker's credentials (set into an http(s) tracker URI,
which MLflow's client and torchx's both honour). An operator's own ``cfg`` and
``trackers`` win over the Connection's. With no such Connection, or a field left out, the
environment is read as before (``TORCHX_HOME``, ``TORCHX_TRACKERS``, ``.torchxconfig``).
Nothing here changes ``os.environ``: the settings are passed to the Runner.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from airflow.sdk import BaseHook

from torchx.runner.api import Runner, get_runner

DEFAULT_CONN_ID = "torchx_default"
CONN_TYPE = "torchx"

Trackers = Optional[Mapping[str, Optional[str]]]


@dataclass(frozen=True)
class TorchXSettings:
    """What a Connection says (None or empty: the environment decides)."""

    torchx_home: Optional[str] = None
    cfg: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    trackers: Optional[Dict[str, Optional[str]]] = None

    def runner(self, trackers: Trackers = None) -> Runner:
        """A Runner with these settings; ``trackers`` (an operator's own) win."""
        chosen = trackers if trackers is not None else self.trackers
        if self.torchx_home:
            return get_runner(trackers=chosen, torchx_home=self.torchx_home)
        return get_runner(trackers=chosen)

    def cfg_for(self, scheduler: str, cfg: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        """The run options of a submission: the Connection's defaults, then ``cfg``'s."""
        return {**self.cfg.get(scheduler, {}), **(cfg or {})}


def settings_from(
    extra: Mapping[str, Any], login: Optional[str], password: Optional[str]
) -> TorchXSettings:
    """The settings a Connection's extra, login and password hold (``ValueError``, one line
    naming the field, when one has the wrong shape)."""
    home = extra.get("torchx_home")
    cfg = extra.get("cfg") or {}
    trackers = extra.get("trackers")
    if home is not None and not isinstance(home, str):
        raise ValueError(f"the torchx Connection's torchx_home is {home!r}; give a path")
    if not isinstance(cfg, dict) or not all(isinstance(v, dict) for v in cfg.values()):
        raise ValueError(
            'the torchx Connection\'s cfg must map a scheduler to its options: {"slurm": {...}}'
        )
    if trackers is not None and not isinstance(trackers, dict):
        raise ValueError(
            'the torchx Connection\'s trackers must map a tracker to its config: {"mlflow": URI}'
        )
    if trackers is not None and login:
        trackers = {k: _with_credentials(v, login, password) for k, v in trackers.items()}
    return TorchXSettings(home or None, dict(cfg), trackers)


def _with_credentials(config: Optional[str], login: str, password: Optional[str]) -> Optional[str]:
    """An http(s) URI with ``login:password@`` (as MLflow's client takes them); any other
    config (a sqlite URI, a config file) as it is."""
    if not config or not config.startswith(("http://", "https://")):
        return config
    parts = urllib.parse.urlsplit(config)
    if "@" in parts.netloc:  # the URI's own credentials win
        return config
    userinfo = urllib.parse.quote(login, safe="")
    if password:
        userinfo += ":" + urllib.parse.quote(password, safe="")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


class TorchXHook(BaseHook):
    """torchx's settings from the Connection ``torchx_conn_id`` (see the module doc);
    ``get_conn`` gives a Runner with them."""

    conn_name_attr = "torchx_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "TorchX"

    def __init__(self, torchx_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.torchx_conn_id = torchx_conn_id
        self._settings: Optional[TorchXSettings] = None

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

    @property
    def settings(self) -> TorchXSettings:
        """The Connection's settings, read once; none (the environment decides) without it."""
        if self._settings is None:
            self._settings = self._read()
        return self._settings

    def _read(self) -> TorchXSettings:
        from airflow.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.torchx_conn_id)
        except AirflowNotFoundException:
            if self.torchx_conn_id != DEFAULT_CONN_ID:  # named on purpose: say it is missing
                raise
            return TorchXSettings()
        return settings_from(conn.extra_dejson, conn.login, conn.password)

    def get_conn(self) -> Runner:
        return self.settings.runner()

    def runner(self, trackers: Trackers = None) -> Runner:
        """A Runner with the Connection's settings; ``trackers`` (an operator's) win."""
        return self.settings.runner(trackers)


def runner_for_connection(conn_id: str = DEFAULT_CONN_ID, trackers: Trackers = None) -> Runner:
    """The Runner the operator and sensor use, for the trigger (same settings)."""
    return TorchXHook(conn_id).runner(trackers)
