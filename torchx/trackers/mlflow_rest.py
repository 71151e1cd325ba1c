"""The Runner's MLflow calls over the tracking server's REST API (``http(s)://`` URIs).

Opening or ending a job's run is a few small requests: no ``import mlflow`` (seconds) on
the submit path, and no "View run" line printed to stdout when a run ends. The same
store methods as ``MLflowTracker`` (``experiment_id``, ``find_run``, ``create_run``,
``tag_run``, ``terminate``), so ``MlflowBackend`` is written once against both.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchx.trackers.api import TrackerConfigError

API = "/api/2.0/mlflow"
TIMEOUT = 10.0
BATCH = 100  # params per log-batch request (the server's limit)
_experiments: Dict[Any, str] = {}  # (server, experiment name) -> id, once per process


class MlflowRestError(TrackerConfigError):
    """The tracking server refused a request, or did not answer."""

    def __init__(self, message: str, error_code: str = "") -> None:
        super().__init__(message)
        self.error_code = error_code


class MlflowRest:
    def __init__(self, tracking_uri: str, timeout: float = TIMEOUT) -> None:
        self.base = tracking_uri.rstrip("/") + API
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        url = self.base + path
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        request = urllib.request.Request(
            url, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            try:
                code = json.loads(detail).get("error_code", "")
            except ValueError:
                code = ""
            raise MlflowRestError(
                f"MLflow {path} failed ({e.code}): {detail[:300]}", code
            ) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise MlflowRestError(f"MLflow server unreachable ({reason})") from None

    def health(self) -> None:
        """Raise ``TrackerConfigError`` (one line) unless the server answers."""
        url = self.base[: -len(API)] + "/health"
        try:
            urllib.request.urlopen(url, timeout=5).read()
        except (urllib.error.URLError, OSError) as e:
            raise TrackerConfigError(
                f"MLflow tracking server {self.base[: -len(API)]} is unreachable"
                f" ({getattr(e, 'reason', e)}); start it or fix the tracker config"
            ) from None

    # ---------------------------------------------------------------- lookups

    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str:
        key = (self.base, name)
        if key not in _experiments:
            _experiments[key] = self._experiment_id(name, artifact_location)
        return _experiments[key]

    def _experiment_id(self, name: str, artifact_location: Optional[str]) -> str:
        try:
            found = self._call("GET", "/experiments/get-by-name", {"experiment_name": name})
            return str(found["experiment"]["experiment_id"])
        except MlflowRestError as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        body: Dict[str, Any] = {"name": name}
        if artifact_location:
            body["artifact_location"] = f"{artifact_location}/{name}"
        try:
            return str(self._call("POST", "/experiments/create", body)["experiment_id"])
        except MlflowRestError:  # created concurrently
            found = self._call("GET", "/experiments/get-by-name", {"experiment_name": name})
            return str(found["experiment"]["experiment_id"])

    def find_run(self, tag: str, value: str) -> Optional[Tuple[str, str]]:
        """(run id, experiment id) of the oldest run whose ``tag`` is ``value``."""
        exps = self._call("POST", "/experiments/search", {"max_results": 1000})
        ids = [e["experiment_id"] for e in exps.get("experiments", [])]
        if not ids:
            return None
        quoted = value.replace("'", "\\'")
        runs = self._call(
            "POST",
            "/runs/search",
            {
                "experiment_ids": ids,
                "filter": f"tags.`{tag}` = '{quoted}'",
                "max_results": 10,
                "order_by": ["attributes.start_time ASC"],
            },
        ).get("runs", [])
        if not runs:
            return None
        return str(runs[0]["info"]["run_id"]), str(runs[0]["info"]["experiment_id"])

    def run_experiment(self, run_id: str) -> str:
        run = self._call("GET", "/runs/get", {"run_id": run_id})
        return str(run["run"]["info"]["experiment_id"])

    # ---------------------------------------------------------------- writes

    def create_run(
        self,
        experiment_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start_ms: int,
    ) -> str:
        run = self._call(
            "POST",
            "/runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": name,
                "start_time": start_ms,
                "tags": [{"key": k, "value": v} for k, v in tags.items()],
            },
        )
        run_id = str(run["run"]["info"]["run_id"])
        items: List[Dict[str, str]] = [{"key": k, "value": v} for k, v in params.items()]
        for i in range(0, len(items), BATCH):
            self._call(
                "POST", "/runs/log-batch", {"run_id": run_id, "params": items[i : i + BATCH]}
            )
        return run_id

    def tag_run(self, run_id: str, key: str, value: str) -> None:
        self._call("POST", "/runs/set-tag", {"run_id": run_id, "key": key, "value": value})

    def terminate(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None:
        body: Dict[str, Any] = {"run_id": run_id, "status": status}
        body["end_time"] = end_ms if end_ms is not None else int(time.time() * 1000)
        self._call("POST", "/runs/update", body)
