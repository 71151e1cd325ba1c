"""``torchx tracker``: list tracked jobs, their metadata and artifacts, and draw lineage."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, List, Set

from torchx.cli.cmd_base import CommandError, SubCommand

if TYPE_CHECKING:
    from torchx.trackers.api import Lineage


def _tracker(spec: str | None) -> Any:
    from torchx.runner.config import get_configured_trackers
    from torchx.trackers.api import build_trackers, tracker_backend

    if spec:
        name, _, config = spec.partition("=")
        trackers: dict[str, str | None] = {name: config or None}
    else:
        trackers = dict(get_configured_trackers())
    if not trackers:
        raise CommandError(
            "no tracker configured;"
            " pass --tracker mlflow[=URI] or set [torchx:tracker] in .torchxconfig"
        )
    first, first_config = next(iter(trackers.items()))
    tracker_backend(first, first_config).validate()
    return build_trackers({first: first_config})[0]


class CmdTracker(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "--tracker",
            default=None,
            help="NAME[=CONFIG], e.g. mlflow=sqlite:///mlflow.db"
            " (default: the first configured tracker)",
        )
        sub = subparser.add_subparsers(dest="tracker_cmd", required=True, metavar="{list,lineage}")
        lst = sub.add_parser("list", help="list jobs, metadata, artifacts or lineage")
        what = lst.add_subparsers(
            dest="list_what", required=True, metavar="{jobs,metadata,artifacts,lineage}"
        )
        jobs = what.add_parser("jobs", help="tracked jobs")
        jobs.add_argument("--parent-run-id", dest="parent_run_id", default=None)
        md = what.add_parser("metadata", help="metadata of a run")
        md.add_argument("run_id")
        art = what.add_parser("artifacts", help="artifacts of a run")
        art.add_argument("--artifact", default=None)
        art.add_argument("run_id")
        top = sub.add_parser("lineage", help="draw the lineage of a run")
        top.set_defaults(list_what=None)
        for lineage in (what.add_parser("lineage", help="lineage of a run"), top):
            lineage.add_argument("run_id")
            lineage.add_argument("--format", choices=["text", "dot", "mermaid"], default="text")

    def run(self, args: argparse.Namespace) -> None:
        tracker = _tracker(args.tracker)
        with tracker.batched_reads():  # what naming the run read, the lineage reuses
            self._run(tracker, args)

    def _run(self, tracker: Any, args: argparse.Namespace) -> None:
        from tabulate import tabulate

        from torchx.trackers.api import AmbiguousRunError

        what = args.list_what
        try:  # a run id, or a unique prefix of one (of a handle, app id, MLflow run id)
            for name in ("run_id", "parent_run_id"):
                if getattr(args, name, None):
                    setattr(args, name, tracker.find_run_id(getattr(args, name)))
        except AmbiguousRunError as e:
            raise CommandError(str(e)) from None
        if args.tracker_cmd == "lineage" or what == "lineage":
            lineage = tracker.pipeline_lineage(args.run_id)
            if not lineage.runs.get(lineage.run_id) and not lineage.edges:
                raise CommandError(f"no tracked run {args.run_id!r}")
            print({"text": as_text, "dot": as_dot, "mermaid": as_mermaid}[args.format](lineage))
        elif what == "jobs":
            kwargs = {"parent_run_id": args.parent_run_id} if args.parent_run_id else {}
            for rid in tracker.run_ids(**kwargs):
                print(rid)
        elif what == "metadata":
            md = tracker.metadata(args.run_id)
            if not md:
                raise CommandError(f"no tracked run {args.run_id!r}")
            print(tabulate(sorted((k, str(v)) for k, v in md.items()), headers=["KEY", "VALUE"]))
        elif what == "artifacts":
            arts = tracker.artifacts(args.run_id)
            rows = [
                [a.name, a.path, a.metadata]
                for a in arts.values()
                if not args.artifact or a.name == args.artifact
            ]
            print(tabulate(rows, headers=["ARTIFACT", "PATH", "METADATA"]))


def _label(lineage: Lineage, run_id: str) -> str:
    kind = lineage.runs.get(run_id, {}).get("stage") or lineage.runs.get(run_id, {}).get("kind")
    return f"{run_id} [{kind}]" if kind else run_id


def as_text(lineage: Lineage) -> str:
    """Upstream tree (what the run consumed, recursively), then the runs that consumed it."""
    lines: List[str] = [_label(lineage, lineage.run_id)]

    def walk(run_id: str, depth: int, seen: Set[str], up: bool) -> None:
        for e in lineage.upstream(run_id) if up else lineage.downstream(run_id):
            other, arrow = (e.source, "<-") if up else (e.target, "->")
            label = _label(lineage, other)
            lines.append(f"{'  ' * depth}{arrow} {e.artifact or 'run'} {arrow} {label}")
            if other not in seen:
                walk(other, depth + 1, seen | {other}, up)

    walk(lineage.run_id, 1, {lineage.run_id}, up=True)
    walk(lineage.run_id, 1, {lineage.run_id}, up=False)
    for stage in lineage.stages:  # a pipeline run: each stage with what it consumed
        lines.append(f"  stage {_label(lineage, stage)}")
        walk(stage, 2, {stage}, up=True)
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
