"""A ``RunStore`` over the tracking server's REST API (``http(s)://`` URIs): a few small
requests, no ``import mlflow`` (seconds) and no "View run" line on stdout."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from torchx.specs.secrets import Masker
from torchx.trackers.api import Latest, MetricRow, TrackerConfigError
from torchx.trackers.mlflow_http import HttpSettings, redact
from torchx.trackers.mlflow_runs import TaggedRun, create_once, oldest_first

API = "/api/2.0/mlflow"
BATCH = 100  # params per log-batch request (the server's limit)
METRICS_BATCH = 1000  # metrics per log-batch request (the server's limit)
# reads of a run's latest metrics while a rank logs: tries for a cut no batch landed in
READ_ATTEMPTS = 3


# a unique-key violation in the server's database (sqlite, MySQL, PostgreSQL)
_DUPLICATE_ROW = re.compile(r"UNIQUE constraint failed|Duplicate entry|duplicate key value")


class MlflowRestError(TrackerConfigError):
    """The tracking server refused a request (its ``error_code``), or did not answer."""

    error_code = ""
    status = 0  # the HTTP status; 0: no answer


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
    """The server at ``tracking_uri``, reached with MLflow's client settings (``settings``,
    else this process's env): credentials, TLS, retries and timeout as MLflow's own."""

    def __init__(self, tracking_uri: str, settings: Optional[HttpSettings] = None) -> None:
        self.uri = tracking_uri.rstrip("/")
        self.root = redact(self.uri)  # what messages show
        self.settings = settings or HttpSettings.from_env()
        self._sessions: Dict[Tuple[int, bool], Any] = {}  # per process: a forked child
        # must not share its parent's connections (MLflow's client keys them by pid too)

    def _call(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]] = None,
        preflight: bool = False,
    ) -> Any:
        import requests  # at the first request: not cheap

        s = self.settings
        key = (os.getpid(), preflight)
        if key not in self._sessions:
            self._sessions[key] = s.session(preflight)
        payload = {"params": body} if method == "GET" else {"json": body}
        try:
            response = self._sessions[key].request(
                method,
                self.uri + path,
                headers=s.headers(),
                verify=s.verify,
                cert=s.client_cert,
                timeout=s.timeout,
                allow_redirects=s.allow_redirects,
                **payload,
            )
        except requests.exceptions.SSLError as e:
            raise MlflowRestError(
                f"not trusted over TLS ({self._reason(e)}); set MLFLOW_TRACKING_SERVER_CERT_PATH to"
                " its CA certificate (or MLFLOW_TRACKING_INSECURE_TLS=true)"
            ) from None
        except requests.exceptions.Timeout:
            raise MlflowRestError(
                f"not answering within {s.timeout:g} s (MLFLOW_HTTP_REQUEST_TIMEOUT)"
            ) from None
        except requests.exceptions.RequestException as e:
            raise MlflowRestError(f"unreachable ({self._reason(e)})") from None
        if response.status_code >= 400:
            raise _refused(path, response.status_code, response.reason, response.text)
        text = response.content
        return json.loads(text) if text.strip().startswith(b"{") else {}

    def _reason(self, e: BaseException) -> str:
        """``_reason`` without this client's credentials (requests names a URL it cannot
        parse, and a header it refuses, with them)."""
        s = self.settings
        return Masker([s.password or "", s.token or ""]).mask(_reason(e))

    def health(self) -> None:
        """Raise ``TrackerConfigError`` (one line) unless the server answers this process's
        credentials (a refused connection or an untrusted certificate is not retried)."""
        try:
            self._call("GET", API + "/experiments/search", {"max_results": 1}, preflight=True)
        except MlflowRestError as e:
            fix = "" if e.status in (401, 403) else "; start it or fix the tracker config"
            raise TrackerConfigError(f"MLflow tracking server {self.root}: {e}{fix}") from None

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
        runs = self.search_tagged(tag, value)
        return (runs[0].run_id, runs[0].experiment_id) if runs else None

    def search_tagged(self, tag: str, value: str) -> List[TaggedRun]:
        """Every active run whose ``tag`` is ``value``, oldest first, with its metrics: one
        experiments search and one runs search per 1000 runs."""
        exps = self._call("POST", API + "/experiments/search", {"max_results": 1000})
        ids = [e["experiment_id"] for e in exps.get("experiments", [])]
        flt, order = f"tags.`{tag}` = '{quote(value)}'", ["attributes.start_time ASC"]
        query: Dict[str, Any] = {
            "experiment_ids": ids,
            "filter": flt,
            "order_by": order,
            "max_results": 1000,
        }
        out: List[TaggedRun] = []
        while ids:
            page = self._call("POST", API + "/runs/search", query)
            for run in page.get("runs", []):
                info, data = run["info"], run.get("data", {})
                metrics = {m["key"]: float(m["value"]) for m in data.get("metrics", [])}
                out.append(
                    TaggedRun(
                        str(info["run_id"]), str(info["experiment_id"]), str(info["status"]),
                        int(info.get("start_time", 0)), metrics,
                    )
                )  # fmt: skip
            if not page.get("next_page_token"):
                break
            query["page_token"] = page["next_page_token"]
        return oldest_first(out)

    def experiment_ids(self) -> List[str]:
        """The active experiments' ids, every page (``runs/search`` names the ones it reads)."""
        ids: List[str] = []
        query: Dict[str, Any] = {"max_results": 1000}
        while True:
            page = self._call("POST", API + "/experiments/search", query)
            ids += [e["experiment_id"] for e in page.get("experiments", [])]
            if not page.get("next_page_token"):
                return ids
            query["page_token"] = page["next_page_token"]

    def search_tags(
        self, exp_ids: Sequence[str], flt: str, limit: int = 50000
    ) -> Dict[str, Dict[str, str]]:
        """{run id: its tags} of the runs in ``exp_ids`` matching ``flt``, oldest first: one
        ``runs/search`` per 1000 runs (a page), at most ``limit`` runs."""
        runs: Dict[str, Dict[str, str]] = {}
        if not exp_ids:
            return runs
        query: Dict[str, Any] = {
            "experiment_ids": list(exp_ids),
            "filter": flt,
            "order_by": ["attributes.start_time ASC"],
        }
        while len(runs) < limit:
            query["max_results"] = min(1000, limit - len(runs))
            page = self._call("POST", API + "/runs/search", query)
            for run in page.get("runs", []):
                tags = run.get("data", {}).get("tags", [])
                runs[str(run["info"]["run_id"])] = {t["key"]: t.get("value", "") for t in tags}
            if not page.get("next_page_token"):
                break
            query["page_token"] = page["next_page_token"]
        return runs

    def run_info(self, run_id: str) -> Optional[Tuple[str, str, str]]:
        """(experiment id, status, artifact URI); None: no such run."""
        try:
            info = self._call("GET", API + "/runs/get", {"run_id": run_id})["run"]["info"]
        except MlflowRestError as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return str(info["experiment_id"]), str(info["status"]), str(info.get("artifact_uri"))

    def latest_metrics(self, run_id: str, by_time: Optional[Iterable[str]] = None) -> Latest:
        """As ``SqliteStore.latest_metrics``, from as few histories as it can (limits:
        docs/progress.md); read again while a batch lands, so a report's keys agree."""
        by_time = None if by_time is None else list(by_time)
        highest = self._highest(run_id)
        for _ in range(READ_ATTEMPTS):
            latest = self._latest(run_id, highest, by_time)
            again = self._highest(run_id)
            if again == highest:
                break  # nothing landed while the histories were read: one consistent cut
            highest = again  # a rank's batch landed in between: its keys may not agree
        return latest

    def _highest(self, run_id: str) -> Dict[str, Tuple[int, int, float]]:
        """MLflow's own row per key (the highest step's): ``{key: (timestamp, step, value)}``."""
        run = self._call("GET", API + "/runs/get", {"run_id": run_id})["run"]
        return {m["key"]: _row(m) for m in run.get("data", {}).get("metrics", [])}

    def _latest(
        self, run_id: str, highest: Dict[str, Tuple[int, int, float]], by_time: Optional[List[str]]
    ) -> Latest:
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

    def create_tagged_run(
        self,
        exp_id: str,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
        start: int,
        key: str,
    ) -> str:
        return create_once(self, exp_id, name, tags, params, start, key)

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
        body = {"run_id": run_id, "key": key, "value": value}
        try:
            self._call("POST", API + "/runs/set-tag", body)
        except MlflowRestError as e:
            if not _DUPLICATE_ROW.search(str(e)):
                raise
            # stages that open one pipeline run tag it at once; MLflow's store reads, then
            # inserts, so a concurrent writer's row can make the insert fail. The row exists
            # now: the same request updates it
            self._call("POST", API + "/runs/set-tag", body)

    def log_metric_rows(self, run_id: str, rows: Sequence[MetricRow]) -> None:
        """One log-batch request per ``METRICS_BATCH`` rows."""
        items = [{"key": k, "value": v, "timestamp": ts, "step": step} for k, v, ts, step in rows]
        for i in range(0, len(items), METRICS_BATCH):
            batch = {"run_id": run_id, "metrics": items[i : i + METRICS_BATCH]}
            self._call("POST", API + "/runs/log-batch", batch)

    def terminate(self, run_id: str, status: str, end_ms: Optional[int] = None) -> None:
        body = {"run_id": run_id, "status": status, "end_time": end_ms or int(time.time() * 1000)}
        self._call("POST", API + "/runs/update", body)

    def delete_run(self, run_id: str) -> None:
        self._call("POST", API + "/runs/delete", {"run_id": run_id})


def quote(value: str) -> str:
    """``value`` inside single quotes of an MLflow search filter."""
    return value.replace("'", "\\'")


def _row(metric: Mapping[str, Any]) -> Tuple[int, int, float]:
    return (int(metric.get("timestamp", 0)), int(metric.get("step", 0)), float(metric["value"]))


def _reason(e: BaseException) -> str:
    """What urllib3 says went wrong (requests wraps it twice), on one line, without the
    connection's repr."""
    from urllib3.exceptions import MaxRetryError

    inner = e.args[0] if e.args and isinstance(e.args[0], BaseException) else e
    if isinstance(inner, MaxRetryError) and inner.reason is not None:
        inner = inner.reason  # what the last retry met (refused, name unknown, TLS)
    text = str(inner)
    return " ".join(re.sub(r"^\w*Connection\(.*?\): ", "", text).split())[:200]


_HINTS = {
    401: "; set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
    " to an account of that server",
    403: "; the account needs a permission on it (MLflow's auth: READ, EDIT, MANAGE)",
}


def _refused(path: str, status: int, reason: str, detail: str) -> MlflowRestError:
    code = re.search(r'"error_code":\s*"(\w+)"', detail)
    words = " ".join(detail.split())[:300]
    error = MlflowRestError(f"refused {path} ({status} {reason}): {words}{_HINTS.get(status, '')}")
    error.error_code, error.status = (code.group(1) if code else ""), status
    return error
