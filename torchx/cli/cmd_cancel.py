"""``torchx cancel HANDLE``: stop an app (idempotent for finished apps)."""

from __future__ import annotations

import argparse

from torchx.cli.cmd_base import SubCommand


class CmdCancel(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("app_handle", help="torchx app handle")

    def run(self, args: argparse.Namespace) -> None:
        from torchx.runner.api import get_runner

        with get_runner() as runner:
            runner.cancel(args.app_handle)
            status = runner.wait(args.app_handle, wait_interval=1, timeout=30)
        print(f"{args.app_handle} {status.state if status else 'UNKNOWN'}")
