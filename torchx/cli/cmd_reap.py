"""``torchx reap [-s SCHEDULER ...] [--dryrun]``: cancel live apps whose owner (the task or
flow run that submitted them) has ended; see docs/orphans.md. Run it on a schedule.
"""

from __future__ import annotations

import argparse

from torchx.cli.cmd_base import CommandError, SubCommand


class CmdReap(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "-s",
            "--scheduler",
            action="append",
            default=None,
            help="scheduler whose apps to check (repeatable; default: local_cwd)",
        )
        subparser.add_argument(
            "--dryrun", action="store_true", help="list the orphans, cancel nothing"
        )
        subparser.add_argument(
            "--airflow_url", default=None, help="Airflow API base URL (default: the owner's)"
        )
        subparser.add_argument(
            "--prefect_url",
            default=None,
            help="Prefect API URL (default: the owner's, else PREFECT_API_URL)",
        )
        subparser.add_argument(
            "--kfp_url", default=None, help="KFP API base URL (default: KF_PIPELINES_ENDPOINT)"
        )

    def run(self, args: argparse.Namespace) -> None:
        from torchx.pipelines.reap import Orchestrators, find_candidates, reap
        from torchx.runner.api import get_runner

        schedulers = args.scheduler or ["local_cwd"]
        with get_runner() as runner:
            unknown = [s for s in schedulers if s not in runner.scheduler_backends()]
            if unknown:
                raise CommandError(
                    f"unknown scheduler {', '.join(unknown)}; choose from "
                    f"{', '.join(sorted(runner.scheduler_backends()))}"
                )
            orchestrators = Orchestrators(args.airflow_url, args.prefect_url, args.kfp_url)
            found = find_candidates(runner, schedulers, orchestrators)
            for c in found:
                print(c.line())
            orphans = [c for c in found if c.orphan]
            if args.dryrun:
                print(f"{len(orphans)} orphan(s) of {len(found)} owned live app(s); dry run")
            else:
                cancelled = reap(runner, orphans, orchestrators)
                for c in orphans:  # each owner was asked again just before its cancel
                    print(f"cancelled {c.handle}" if c.handle in cancelled else c.line())
                print(f"{len(cancelled)} orphan(s) cancelled of {len(found)} owned live app(s)")
        errors = [c.error for c in found if c.error]
        if errors:
            raise CommandError(
                f"torchx reap: {len(errors)} app(s) kept, their owner could not be asked: "
                f"{errors[0]}"
            )
