"""``torchx runopts [SCHEDULER]``: the run options (-cfg) each scheduler accepts."""

from __future__ import annotations

import argparse

from torchx.cli.cmd_base import SubCommand


class CmdRunopts(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "scheduler", nargs="?", default=None, help="scheduler (default: all)"
        )

    def run(self, args: argparse.Namespace) -> None:
        from torchx.runner.api import get_runner
        from torchx.specs.api import UnknownSchedulerException
        from torchx.util.modules import MissingExtraError

        with get_runner() as runner:
            names = runner.scheduler_backends()
            if args.scheduler and args.scheduler not in names:
                raise UnknownSchedulerException(args.scheduler, sorted(names))
            for name in [args.scheduler] if args.scheduler else names:
                try:
                    opts = runner.scheduler_run_opts(name)
                except MissingExtraError as e:
                    if args.scheduler:
                        raise
                    print(f"{name}:\n    (unavailable: {e})\n")
                    continue
                print(f"{name}:\n{opts!r}\n")
