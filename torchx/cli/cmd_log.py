"""``torchx log SCHEDULER://SESSION/APP_ID[/ROLE[/REPLICA_IDS]]``: print or follow logs."""

from __future__ import annotations

import argparse
import re
import sys

from torchx.cli.cmd_base import CommandError, SubCommand, no_such_app

_ID_RE = re.compile(
    r"^(?P<scheduler>[^:/]+)://(?P<session>[^/]*)/(?P<app_id>[^/]+)(/(?P<role>[^/]+)?(/(?P<ids>[\d,]+))?)?/?$"
)


class CmdLog(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "identifier", help="SCHEDULER://[SESSION]/APP_ID[/ROLE[/REPLICA_IDS,...]]"
        )
        subparser.add_argument("--regex", default=None, help="only lines matching this regex")
        subparser.add_argument(
            "-t", "--tail", action="store_true", help="follow the logs until the app ends"
        )
        subparser.add_argument(
            "--streams",
            choices=["stdout", "stderr", "combined"],
            default=None,
            help="which stream (default: combined where supported)",
        )

    def run(self, args: argparse.Namespace) -> None:
        from torchx.cli.logs import stream_logs
        from torchx.cli.masking import masker
        from torchx.runner.api import get_runner
        from torchx.runner.logs import replicas_of
        from torchx.schedulers.api import Stream
        from torchx.specs.api import MalformedAppHandleException, make_app_handle

        if args.regex is not None:
            try:
                re.compile(args.regex)
            except re.error as e:
                raise CommandError(f"invalid --regex {args.regex!r}: {e}", 2) from None
        m = _ID_RE.match(args.identifier)
        if not m:
            raise MalformedAppHandleException(args.identifier)
        handle = make_app_handle(m["scheduler"], m["session"], m["app_id"])
        ids = [int(i) for i in m["ids"].split(",") if i] if m["ids"] else None
        with get_runner() as runner:
            if runner.status(handle) is None:
                raise no_such_app(handle, m["scheduler"])
            pairs = replicas_of(runner, handle, m["role"], ids)
            for role in app.roles if (app := runner.describe(handle)) else []:
                masker().add_env(role.env)  # the job may print its own secrets
            if not pairs:
                raise CommandError(f"app {handle} has no role/replica matching {args.identifier!r}")
            streams = Stream(args.streams) if args.streams else None
            errors = stream_logs(runner, handle, pairs, args.tail, args.regex, streams, sys.stdout)
        if errors:
            raise CommandError(f"could not read logs: {errors[0]}")
