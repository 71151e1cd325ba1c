"""When an AWS Batch job last showed life, for stall detection by its waiter
(``Scheduler.last_activity``, ``torchx.runner.stall``).

Batch has no progress channel a waiter can read, so activity is output: the newest
CloudWatch Logs event of any node (``get_log_events`` from the tail, one event: its
``timestamp`` is when the container wrote the line, unlike a stream's
``lastEventTimestamp``, which AWS updates only eventually), or the job's start for a job
that has printed nothing yet. Lines reach CloudWatch within seconds (the awslogs driver
buffers briefly): pick a stall timeout well above that.

Never on doubt: a job not RUNNING, any of whose nodes is not RUNNING (the job reads
RUNNING once its main node runs, while the others may still be STARTING and the running
ranks wait quietly in rendezvous; or nodes ended before Batch marked the job done),
without a start time, or whose logs cannot be read (an API error, e.g. no permission)
gives None, and no waiter stops it. A node whose
stream does not exist yet has printed nothing: its start counts.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional


def newest_activity(
    log_client: Any,
    log_group: str,
    job: Dict[str, Any],
    node_jobs: List[Dict[str, Any]],
    nodes: int,
    stream_of: Callable[[int], Optional[str]],
) -> Optional[float]:
    """Epoch seconds of ``job``'s newest log event over its ``nodes`` nodes (``node_jobs``
    as Batch describes them; ``stream_of`` a node's log stream), or of its start."""
    from botocore.exceptions import BotoCoreError, ClientError

    if len(node_jobs) < nodes or any(n.get("status") != "RUNNING" for n in node_jobs):
        return None  # a node not running yet (its peers wait quietly for it) or ended
    starts = [job.get("startedAt")]
    starts += [n.get("startedAt") for n in node_jobs]
    times: List[float] = [float(t) for t in starts if t]
    if not times:
        return None
    for i in range(nodes):
        stream = stream_of(i)
        if stream is None:  # Batch names a node's stream once its container started
            continue
        try:
            resp = log_client.get_log_events(
                logGroupName=log_group,
                logStreamName=stream,
                startFromHead=False,
                limit=1,
            )
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                continue  # the node has written nothing yet: its start counts
            return None
        except BotoCoreError:
            return None
        times += [float(e["timestamp"]) for e in resp.get("events") or [] if e.get("timestamp")]
    return max(times) / 1000.0
