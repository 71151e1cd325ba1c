"""``torchx list -s SCHEDULER``: the apps a scheduler knows."""

from __future__ import annotations

import argparse

from torchx.cli.cmd_base import SubCommand


class CmdList(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "-s", "--scheduler", default="local_cwd", help="scheduler to list (default: local_cwd)"
        )

    def run(self, args: argparse.Namespace) -> None:
        from tabulate import tabulate

        from torchx.runner.api import get_runner

        with get_runner() as runner:
            apps = runner.list(args.scheduler)
        rows = [[a.app_handle, a.name, str(a.state)] for a in apps]
        print(tabulate(rows, headers=["APP HANDLE", "APP NAME", "APP STATUS"]))
