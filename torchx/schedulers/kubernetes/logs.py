"""Reading and following a replica's pod log for the kubernetes scheduler.

The log is streamed with the client's ``follow`` as the API server sends it, re-cut into
whole lines that keep their ``\\n`` (upstream torchx#983 lost them). While a tailed
replica has no pod yet (or its container has not started), the pod is looked up again
until the app ends. ``until`` is applied with the API server's per-line timestamps.
"""

from __future__ import annotations

import codecs
import re
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, Optional

from torchx.schedulers.api import split_lines_iterator
from torchx.schedulers.kubernetes.api import api_errors

TAIL_POLL_SECONDS = 1.0


def pod_log_lines(
    core_api: Callable[[], Any],
    pod_name: Callable[[], Optional[str]],
    app_ended: Callable[[], bool],
    namespace: str,
    since: Optional[datetime],
    until: Optional[datetime],
    should_tail: bool,
) -> Iterator[str]:
    """Lines of the pod ``pod_name`` names; with ``should_tail``, wait for it and follow it.

    ``core_api`` makes a ``CoreV1Api``; ``app_ended`` says when to stop waiting for a pod.
    """
    from kubernetes.client.rest import ApiException

    kwargs: Dict[str, Any] = {}
    if since is not None:
        kwargs["since_seconds"] = max(1, int(time.time() - since.timestamp()))
    if until is not None:
        kwargs["timestamps"] = True
        until = until.astimezone(timezone.utc)  # a naive time is local time
    with api_errors():  # errors surface while the lines are read
        while True:
            name = pod_name()
            if name is not None:
                try:
                    resp = core_api().read_namespaced_pod_log(
                        name,
                        namespace,
                        follow=should_tail,
                        _preload_content=False,
                        **kwargs,
                    )
                except ApiException as e:
                    if e.status not in (400, 404):  # 400: container not started yet
                        raise
                else:
                    yield from response_lines(resp, until)
                    return
            if not should_tail or app_ended():
                return
            time.sleep(TAIL_POLL_SECONDS)


def response_lines(resp: Any, until: Optional[datetime]) -> Iterator[str]:
    """Whole lines (keeping ``\\n``) from a streamed log response, as chunks arrive."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chunks = (decoder.decode(c) for c in resp.stream(amt=64 * 1024, decode_content=True))
    try:
        for line in split_lines_iterator(chunks):
            if until is None:
                yield line
                continue
            stamp, _, text = line.partition(" ")
            if parse_time(stamp) > until:
                return
            yield text
    finally:
        resp.release_conn()


def parse_time(stamp: str) -> datetime:
    """An RFC 3339 log timestamp (nanoseconds cut to micro); garbage sorts first."""
    try:
        value = re.sub(r"(\.\d{6})\d+", r"\1", stamp.rstrip("Z"))
        return datetime.fromisoformat(value).replace(tzinfo=timezone.utc)
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
