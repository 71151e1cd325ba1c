"""``torchx configure``: write ./.torchxconfig with the schedulers' run options."""

from __future__ import annotations

import argparse
import os

from torchx.cli.cmd_base import CommandError, SubCommand


class CmdConfigure(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "-s",
            "--schedulers",
            default="local_cwd",
            help="comma-separated schedulers (default: local_cwd)",
        )
        subparser.add_argument(
            "--print",
            dest="print_only",
            action="store_true",
            help="print instead of writing ./.torchxconfig",
        )
        subparser.add_argument(
            "-a",
            "--all",
            action="store_true",
            help="write every option, not only the required ones",
        )

    def run(self, args: argparse.Namespace) -> None:
        from torchx.runner import config

        schedulers = [s for s in args.schedulers.split(",") if s]
        text = config.dumps(schedulers, required_only=not args.all)
        if args.print_only:
            print(text, end="")
            return
        path = os.path.join(os.getcwd(), config.CONFIG_FILE)
        if os.path.exists(path):
            raise CommandError(
                f"{path} already exists; use --print to see the options and edit it yourself"
            )
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")
