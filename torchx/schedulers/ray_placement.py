"""Whether a Ray cluster can hold a torchx job's placement group, from its dashboard's REST
API alone (the submitter has no GCS address): the live nodes' total resources, whether the
autoscaler may add nodes, and why a submitted job's placement group still waits."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from torchx.schedulers.ray_driver import placement_group_name


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


@dataclass
class Cluster:
    """What a Ray cluster holds: each live node's total resources, and whether its
    autoscaler may add nodes."""

    nodes: List[Dict[str, float]]
    may_grow: bool


def cluster_at(url: str) -> Optional[Cluster]:
    """The cluster behind dashboard ``url`` from its REST API (the State API's
    ``/api/v0/nodes``, which ``ray list nodes`` reads, and ``/api/cluster_status``, which the
    dashboard's overview reads); None if it does not answer (doubt refuses nothing)."""
    alive = "filter_keys=state&filter_predicates=%3D&filter_values=ALIVE"
    try:
        nodes = _get_json(f"{url}/api/v0/nodes?limit=10000&detail=1&{alive}")
        status = _get_json(f"{url}/api/cluster_status")
        listed = nodes["data"]["result"]["result"]
        report = ((status.get("data") or {}).get("clusterStatus") or {}).get("autoscalerReport")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return Cluster([dict(n.get("resources_total") or {}) for n in listed], may_grow(report))


def may_grow(report: Optional[Dict[str, Any]]) -> bool:
    """Whether the autoscaler may add nodes. Ray 2.60 has no public field for it: a head
    started with ``ray start`` (no cluster config) runs an autoscaler whose node types are
    its nodes' own (``node_<node id>``) and that launches nothing; anything else (no
    report: autoscaler v2, KubeRay; configured node types; launches) may grow."""
    if not report:
        return True
    if report.get("pendingNodes") or report.get("pendingLaunches"):
        return True
    mapping = report.get("nodeTypeMapping") or {}
    return not mapping or any(t != f"node_{n}" for n, t in mapping.items())


def _fits(bundles: List[Dict[str, float]], nodes: List[Dict[str, float]]) -> Optional[bool]:
    """Whether some assignment of the bundles to the nodes holds them all (None: the
    search gave up, which refuses nothing)."""
    order = sorted(bundles, key=lambda b: sorted(b.values(), reverse=True), reverse=True)
    free = [dict(n) for n in nodes]
    budget = [100_000]

    def place(i: int) -> Optional[bool]:
        if i == len(order):
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return None
        tried = set()
        for node in free:
            key = tuple(sorted(node.items()))
            if key in tried:  # an equal node fails alike
                continue
            tried.add(key)
            if all(node.get(k, 0.0) >= v for k, v in order[i].items()):
                for k, v in order[i].items():
                    node[k] -= v
                found = place(i + 1)
                for k, v in order[i].items():
                    node[k] += v
                if found is not False:
                    return found
        return False

    return place(0)


def _resources(r: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(r.items())) or "nothing"


def unplaceable(
    bundles: List[Dict[str, float]], cluster: Optional[Cluster], where: str, app_id: str
) -> Optional[str]:
    """Why no combination of ``cluster``'s nodes can ever hold ``bundles`` (None: it can,
    it may grow, or it is unknown)."""
    if cluster is None or cluster.may_grow:
        return None
    asked = sorted({k for b in bundles for k in b})
    nodes = [{k: float(n.get(k, 0.0)) for k in asked} for n in cluster.nodes]
    if _fits(bundles, nodes) is not False:
        return None
    want: Dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            want[k] = want.get(k, 0.0) + v
    have: Dict[str, float] = {k: sum(n[k] for n in nodes) for k in asked}
    largest = max(nodes, key=lambda n: sorted(n.values(), reverse=True), default={})
    return (
        f"the Ray cluster at {where} can never place {app_id}: it asks"
        f" {len(bundles)} replica(s) of [{'], ['.join(_resources(b) for b in bundles)}]"
        f" ({_resources(want)} in all) and has {len(nodes)} node(s), the largest"
        f" [{_resources(largest)}] ({_resources(have)} in all), and adds none:"
        " ask for fewer replicas or resources (e.g. --cpu)"
    )


def placement_wait(url: str, job_id: str) -> Optional[str]:
    """Why the job's replicas wait (its driver's placement group not placed yet), None if
    they do not (placed, not asked yet, or the dashboard does not say)."""
    name = urllib.parse.quote(placement_group_name(job_id))
    query = f"limit=10&detail=1&filter_keys=name&filter_predicates=%3D&filter_values={name}"
    try:
        groups = _get_json(f"{url}/api/v0/placement_groups?{query}")["data"]["result"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for group in groups:
        if group.get("state") in ("PENDING", "RESCHEDULING"):
            stats = group.get("stats") or {}
            reason = str(stats.get("scheduling_state") or group["state"]).lower().replace("_", " ")
            asked = [_resources(b.get("unit_resources") or {}) for b in group.get("bundles") or []]
            return f"waiting for resources ({reason}): its replicas ask [{'], ['.join(asked)}]"
    return None
