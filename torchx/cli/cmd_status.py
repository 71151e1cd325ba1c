"""``torchx status HANDLE``: the app's state, replicas and error, and the last progress
report of its rank 0 (``torchx.trackers.report_progress``) if it made any."""

from __future__ import annotations

import argparse
import json

from torchx.cli.cmd_base import SubCommand, no_such_app


class CmdStatus(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "app_handle", help="torchx app handle, e.g. local_cwd://torchx/echo-abc123"
        )
        subparser.add_argument(
            "--roles", default="", help="comma-separated roles to show (default: all)"
        )
        subparser.add_argument("--json", action="store_true", help="print JSON")

    def run(self, args: argparse.Namespace) -> None:
        from torchx.runner.api import get_runner

        roles = [r for r in args.roles.split(",") if r] or None
        with get_runner() as runner:
            status = runner.status(args.app_handle)
            progress = runner.progress(args.app_handle) if status is not None else None
        if status is None:
            raise no_such_app(args.app_handle)
        if args.json:
            doc = status.to_json(roles)
            if progress is not None:
                doc["progress"] = progress.to_json()
            print(json.dumps(doc, indent=2))
        else:
            print(status.format(roles))
            if progress is not None:
                print(f"  progress: {progress.format(running=not status.is_terminal())}")
