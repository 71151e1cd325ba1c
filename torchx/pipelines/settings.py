"""torchx's settings that every process touching a stage needs, as an orchestrator's own
configuration holds them (an Airflow Connection, a Prefect block) before env vars: the
state location (``TORCHX_HOME``), run-option defaults per scheduler, and the trackers with
their credentials. Passed to the Runner explicitly: nothing here changes ``os.environ``.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

if TYPE_CHECKING:  # the Runner loads when one is made (Airflow's plugins import this)
    from torchx.runner.api import Runner

Trackers = Optional[Mapping[str, Optional[str]]]


@dataclass(frozen=True)
class TorchXSettings:
    """What the orchestrator's configuration says (None or empty: the environment decides)."""

    torchx_home: Optional[str] = None
    cfg: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    trackers: Optional[Dict[str, Optional[str]]] = None

    def runner(self, trackers: Trackers = None) -> Runner:
        """A Runner with these settings; ``trackers`` (an operator's own) win."""
        from torchx.runner.api import get_runner

        chosen = trackers if trackers is not None else self.trackers
        return get_runner(trackers=chosen, **home_param(self.torchx_home))

    def cfg_for(self, scheduler: str, cfg: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        """The run options of a submission: these defaults, then ``cfg``'s."""
        return {**self.cfg.get(scheduler, {}), **(cfg or {})}


def home_param(torchx_home: Optional[str]) -> Dict[str, Any]:
    """The schedulers' ``torchx_home`` parameter when one was given (local_cwd and Slurm
    read it; the others take and ignore it)."""
    return {"torchx_home": torchx_home} if torchx_home else {}


def settings_from(
    extra: Mapping[str, Any], login: Optional[str], password: Optional[str]
) -> TorchXSettings:
    """The settings an orchestrator's record holds (an Airflow Connection's extra, login and
    password): ``ValueError``, one line naming the field, when one has the wrong shape."""
    home = extra.get("torchx_home")
    cfg = extra.get("cfg") or {}
    trackers = extra.get("trackers")
    if home is not None and not isinstance(home, str):
        raise ValueError(f"torchx settings: torchx_home is {home!r}; give a path")
    if not isinstance(cfg, dict) or not all(isinstance(v, dict) for v in cfg.values()):
        raise ValueError(
            'torchx settings: cfg must map a scheduler to its options: {"slurm": {...}}'
        )
    if trackers is not None and not isinstance(trackers, dict):
        raise ValueError(
            'torchx settings: trackers must map a tracker to its config: {"mlflow": URI}'
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
