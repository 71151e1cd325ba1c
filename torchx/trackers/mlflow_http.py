"""An MLflow tracking server reached as MLflow's own client reaches it: its documented client
settings from the environment, with MLflow's defaults (docs/tracking.md). ``redact`` gives
a URI without its credentials, for every message and link."""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Union

from torchx.trackers.api import TrackerConfigError
from torchx.util.modules import import_optional

if TYPE_CHECKING:
    import requests

# what MLflow's client reads (mlflow.environment_variables); a job's ranks get the ones set
CLIENT_SETTINGS = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER",
    "MLFLOW_ALLOW_HTTP_REDIRECTS",
)
TRANSIENT = frozenset({408, 429, 500, 502, 503, 504})  # the statuses MLflow's client retries


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "").strip().lower()
    if value in ("true", "1", "false", "0", ""):
        return value in ("true", "1") if value else default
    raise TrackerConfigError(f"${name} is {value!r}; set it to true or false")


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        raise TrackerConfigError(f"${name} is {env[name]!r}; set it to a number") from None


@dataclass(frozen=True)
class HttpSettings:
    """MLflow's client settings, with its defaults (7 retries, backoff factor 2 s and 1 s of
    jitter, a 120 s timeout, TLS verified)."""

    username: Optional[str] = None
    password: Optional[str] = None
    token: Optional[str] = None
    verify: Union[bool, str] = True  # False: MLFLOW_TRACKING_INSECURE_TLS; str: a CA bundle
    client_cert: Optional[str] = None
    max_retries: int = 7
    backoff_factor: float = 2.0
    backoff_jitter: float = 1.0
    timeout: float = 120.0
    respect_retry_after: bool = True
    allow_redirects: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> HttpSettings:
        insecure = _flag(env, "MLFLOW_TRACKING_INSECURE_TLS", False)
        ca = env.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None
        if insecure and ca:  # MLflow refuses both too
            raise TrackerConfigError(
                "MLFLOW_TRACKING_INSECURE_TLS and MLFLOW_TRACKING_SERVER_CERT_PATH are both set;"
                " unset one"
            )
        return cls(
            username=env.get("MLFLOW_TRACKING_USERNAME") or None,
            password=env.get("MLFLOW_TRACKING_PASSWORD") or None,
            token=env.get("MLFLOW_TRACKING_TOKEN") or None,
            verify=False if insecure else ca or True,
            client_cert=env.get("MLFLOW_TRACKING_CLIENT_CERT_PATH") or None,
            max_retries=int(_number(env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES", 7)),
            backoff_factor=_number(env, "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 2),
            backoff_jitter=_number(env, "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", 1.0),
            timeout=_number(env, "MLFLOW_HTTP_REQUEST_TIMEOUT", 120),
            respect_retry_after=_flag(env, "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER", True),
            allow_redirects=_flag(env, "MLFLOW_ALLOW_HTTP_REDIRECTS", True),
        )

    def headers(self) -> Dict[str, str]:
        """As MLflow's client: basic auth from a username and password, else a bearer token
        (credentials in the URI, or in ``~/.netrc``, are applied by ``requests`` as for it)."""
        import base64

        if self.username and self.password:
            pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def session(self, preflight: bool = False) -> requests.Session:
        """A session retrying transient failures as MLflow's client does. ``preflight``:
        a refused connection or a TLS failure fails at once (the server is not there, or
        not trusted: minutes of retries would not change it)."""
        requests = import_optional("requests", "mlflow")  # MLflow's client depends on it
        from urllib3.util import Retry

        n = self.max_retries
        retry = Retry(
            total=n,
            connect=0 if preflight else n,
            other=0 if preflight else n,
            read=n,
            redirect=n,
            status=n,
            status_forcelist=TRANSIENT,
            allowed_methods=None,  # every method, POST included, as MLflow's client
            backoff_factor=self.backoff_factor,
            backoff_jitter=self.backoff_jitter,
            raise_on_status=False,  # the last answer, to name its status
            respect_retry_after_header=self.respect_retry_after,
        )
        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(max_retries=retry)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session


def redact(uri: str) -> str:
    """The URI as messages, links and records may show it: without ``user:password@``."""
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def client_env(env: Mapping[str, str] = os.environ) -> Dict[str, str]:
    """MLflow's client settings set in ``env``: what a job's ranks need to reach the server
    as this process does (carried in the job's env, as MLflow's own variables)."""
    return {k: env[k] for k in CLIENT_SETTINGS if env.get(k)}
