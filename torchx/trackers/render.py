"""Draw a Lineage as an indented text tree, Graphviz dot, or a Mermaid flowchart."""

from __future__ import annotations

from typing import List, Set

from torchx.trackers.api import Lineage


def _label(lineage: Lineage, run_id: str) -> str:
    kind = lineage.runs.get(run_id, {}).get("stage") or lineage.runs.get(run_id, {}).get("kind")
    return f"{run_id} [{kind}]" if kind else run_id


def as_text(lineage: Lineage) -> str:
    """Upstream tree (what the run consumed, recursively), then the runs that consumed it."""
    lines: List[str] = [_label(lineage, lineage.run_id)]

    def up(run_id: str, depth: int, seen: Set[str]) -> None:
        for e in lineage.upstream(run_id):
            lines.append(f"{'  ' * depth}<- {e.artifact or 'run'} <- {_label(lineage, e.source)}")
            if e.source not in seen:
                up(e.source, depth + 1, seen | {e.source})

    def down(run_id: str, depth: int, seen: Set[str]) -> None:
        for e in lineage.downstream(run_id):
            lines.append(f"{'  ' * depth}-> {e.artifact or 'run'} -> {_label(lineage, e.target)}")
            if e.target not in seen:
                down(e.target, depth + 1, seen | {e.target})

    up(lineage.run_id, 1, {lineage.run_id})
    down(lineage.run_id, 1, {lineage.run_id})
    for stage in lineage.stages:  # a pipeline run: each stage with what it consumed
        lines.append(f"  stage {_label(lineage, stage)}")
        up(stage, 2, {stage})
    return "\n".join(lines)


def as_dot(lineage: Lineage) -> str:
    out = ["digraph lineage {", "  rankdir=LR;"]
    for rid in sorted(lineage.runs):
        style = ", style=bold" if rid == lineage.run_id else ""
        out.append(f'  "{rid}" [label="{_label(lineage, rid)}"{style}];')
    for e in lineage.edges:
        out.append(f'  "{e.source}" -> "{e.target}" [label="{e.artifact or ""}"];')
    if lineage.stages:
        out.append(f'  subgraph "cluster_pipeline" {{ label="{lineage.run_id}";')
        out.extend(f'    "{stage}";' for stage in lineage.stages)
        out.append("  }")
    out.append("}")
    return "\n".join(out)


def as_mermaid(lineage: Lineage) -> str:
    ids = {rid: f"r{i}" for i, rid in enumerate(sorted(lineage.runs))}
    out = ["flowchart LR"]
    for rid, node in ids.items():
        if rid not in lineage.stages:
            out.append(f'  {node}["{_label(lineage, rid)}"]')
    if lineage.stages:
        out.append(f'  subgraph pipeline["{lineage.run_id}"]')
        out.extend(f'    {ids[s]}["{_label(lineage, s)}"]' for s in lineage.stages if s in ids)
        out.append("  end")
    for e in lineage.edges:
        label = f"|{e.artifact}|" if e.artifact else ""
        out.append(f"  {ids[e.source]} -->{label} {ids[e.target]}")
    return "\n".join(out)
