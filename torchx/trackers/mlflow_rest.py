"""MLflow calls over the tracking server's REST API (``http(s)://`` URIs): a few small
requests, no ``import mlflow`` (seconds) and no "View run" line on stdout. The same store
methods as ``SqliteStore`` and ``MLflowTracker``, so ``MlflowBackend`` is written once."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from torchx.trackers.api import Latest, TrackerConfigError

API = "/api/2.0/mlflow"
TIMEOUT = 10.0
BATCH = 100  # params per log-batch request (the server's limit)


class MlflowRestError(TrackerConfigError):
    """The tracking server refused a request (its ``error_code``), or did not answer."""

    error_code = ""


class DeletedExperimentError(TrackerConfigError):
    """The experiment of that name is deleted: MLflow keeps runs out of it (``mlflow gc``
    destroys them), and so does torchx."""

    def __init__(self, name: str, exp_id: object) -> None:
        super().__init__(
            f"the MLflow experiment {name!r} (id {exp_id}) is deleted; restore it"
            f" (mlflow experiments restore --experiment-id {exp_id}) or set another experiment"
            " name (experiment_name in the tracker config, or $TORCHX_TRACKING_EXPERIMENT_NAME)"
        )


class MlflowRest:
    def __init__(self, tracking_uri: str, timeout: float = TIMEOUT) -> None:
        self.root = tracking_uri.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        import urllib.error  # at the first request: http.client and email are not cheap
        import urllib.parse
        import urllib.request

        url, data = self.root + path, None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            code = re.search(r'"error_code":\s*"(\w+)"', detail)
            error = MlflowRestError(f"{path} failed ({e.code}): {detail[:300]}")
            error.error_code = code.group(1) if code else ""
            raise error from None
        except (urllib.error.URLError, OSError) as e:
            raise MlflowRestError(f"unreachable ({getattr(e, 'reason', e)})") from None
        return json.loads(text) if text.strip().startswith(b"{") else {}

    def health(self) -> None:
        """Raise ``TrackerConfigError`` (one line) unless the server answers."""
        try:
            self._call("GET", "/health")
        except MlflowRestError as e:
            raise TrackerConfigError(
                f"MLflow tracking server {self.root} is {e}; start it or fix the tracker config"
            ) from None

    def experiment_id(self, name: str, artifact_location: Optional[str] = None) -> str:
        """Looked up on every call (one GET): a cached id would outlive its experiment."""
        get = ("GET", API + "/experiments/get-by-name", {"experiment_name": name})
        body: Dict[str, Any] = {"name": name}
        if artifact_location:
            body["artifact_location"] = f"{artifact_location}/{name}"
        try:
            found = self._call(*get)["experiment"]
        except MlflowRestError as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            try:
                found = self._call("POST", API + "/experiments/create", body)
            except MlflowRestError:  # created concurrently
                found = self._call(*get)["experiment"]
        if found.get("lifecycle_stage") == "deleted":
            raise DeletedExperimentError(name, found["experiment_id"])
        return str(found["experiment_id"])

    def find_run(self, tag: str, value: str) -> Optional[Tuple[str, str]]:
        """(run id, experiment id) of the oldest run whose ``tag`` is ``value``."""
        exps = self._call("POST", API + "/experiments/search", {"max_results": 1000})
        ids = [e["experiment_id"] for e in exps.get("experiments", [])]
        quoted, order = value.replace("'", "\\'"), ["attributes.start_time ASC"]
        query = {"experiment_ids": ids, "filter": f"tags.`{tag}` = '{quoted}'", "order_by": order}
        runs = self._call("POST", API + "/runs/search", {**query, "max_results": 1}).get("runs")
        info = runs[0]["info"] if runs else None
        return (str(info["run_id"]), str(info["experiment_id"])) if info else None

    def run_info(self, run_id: str) -> Tuple[str, str, str]:
        info = self._call("GET", API + "/runs/get", {"run_id": run_id})["run"]["info"]
        return str(info["experiment_id"]), str(info["status"]), str(info.get("artifact_uri"))

    def latest_metrics(self, run_id: str, by_time: Optional[Iterable[str]] = None) -> Latest:
        """As ``SqliteStore.latest_metrics``, from histories: with ``by_time`` only theirs (per-
        step metrics can be millions of points), else MLflow's highest-step rows, or every
        history once a ``by_time`` key's step went back (limits: docs/progress.md)."""
        run = self._call("GET", API + "/runs/get", {"run_id": run_id})["run"]
        highest = {m["key"]: _row(m) for m in run.get("data", {}).get("metrics", [])}
        keys = list(highest) if by_time is None else [k for k in by_time if k in highest]
        newest = {k: self._newest(run_id, k) or highest[k] for k in keys}
        if any(newest[k][1] < highest[k][1] for k in keys):  # a step went back
            newest = {k: newest.get(k) or self._newest(run_id, k) or highest[k] for k in highest}
        return {k: (value, ts) for k, (ts, _, value) in {**highest, **newest}.items()}

    def _newest(self, run_id: str, key: str) -> Optional[Tuple[int, int, float]]:
        """(timestamp, step, value) of ``key``'s newest row by time, paging its history."""
        newest: Optional[Tuple[int, int, float]] = None
        query: Dict[str, str] = {"run_id": run_id, "metric_key": key}
        while True:
            page = self._call("GET", API + "/metrics/get-history", query)
            for m in page.get("metrics", []):
                newest = _row(m) if newest is None else max(newest, _row(m))
            if not page.get("next_page_token"):
                return newest
            query["page_token"] = page["next_page_token"]

    def create_run(
        self, exp_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, str], start: int
    ) -> str:
        pairs = [{"key": k, "value": v} for k, v in tags.items()]
        body = {"experiment_id": exp_id, "run_name": name, "start_time": start, "tags": pairs}
        run_id = str(self._call("POST", API + "/runs/create", body)["run"]["info"]["run_id"])
        items = [{"key": k, "value": v} for k, v in params.items()]
        for i in range(0, len(items), BATCH):
            batch = {"run_id": run_id, "params": items[i : i + BATCH]}
            self._call("POST", API + "/runs/log-batch", batch)
        return run_id

    def tag_run(self, run_id: str, key: str, value: str) -> None:
        self._call("POST", API + "/runs/set-tag", {"run_id": run_id, "key": key, "value": value})

    def log_run_metrics(
        self, run_id: str, metrics: Mapping[str, float], ts: int, step: int
    ) -> None:
        rows = [
            {"key": k, "value": float(v), "timestamp": ts, "step": step} for k, v in metrics.items()
        ]
        self._call("POST", API + "/runs/log-batch", {"run_id": run_id, "metrics": rows})

    def terminate(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None:
        body = {"run_id": run_id, "status": status, "end_time": end_ms or int(time.time() * 1000)}
        self._call("POST", API + "/runs/update", body)


def _row(metric: Mapping[str, Any]) -> Tuple[int, int, float]:
    return (int(metric.get("timestamp", 0)), int(metric.get("step", 0)), float(metric["value"]))
