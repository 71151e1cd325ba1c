"""``torchx torchrun``: a torchrun command line, with torchrun's own flags, as the
``dist.ddp`` app ``torchx run`` submits for the same job.

Without ``-s`` it runs on ``local_cwd`` in the foreground, as torchrun would (streamed,
Ctrl-C cancels, torchrun's exit code); with ``-s SCHEDULER`` it submits and returns, or with
``--wait`` runs in the foreground there too. In the foreground SIGINT cancels the job and
exits 130 also when a shell started the verb in the background (``torchx torchrun ... &``
then ``kill -INT``), which leaves SIGINT ignored in it: the verb handles SIGINT for its wait,
as torchrun does.
"""

from __future__ import annotations

import argparse
import sys

from torchx.cli.cmd_run import (
    CmdRun,
    add_cfg_argument,
    block_sigint,
    check_script_exists,
    check_stall_timeout,
    resolve_workspace,
)

LOCAL = "local_cwd"


class CmdTorchrun(CmdRun):
    add_help = False  # -h is the named resource, as in dist.ddp

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        from torchx.components import torchrun

        subparser.add_argument("--help", action="help", help="show this help message and exit")
        where = subparser.add_argument_group("torchx (where the job runs)")
        where.add_argument(
            "-s",
            "--scheduler",
            default=None,
            help=f"submit to this scheduler and return (default: {LOCAL}, in the foreground)",
        )
        add_cfg_argument(where)
        where.add_argument(
            "--wait",
            action="store_true",
            help="with -s: wait for the job in the foreground, streaming its logs, and exit with"
            " its exit code (0 if it succeeded), as without -s; Ctrl-C or SIGTERM cancels it",
        )
        where.add_argument(
            "--dryrun",
            action="store_true",
            help="print the dist.ddp app and the scheduler request without submitting",
        )
        where.add_argument(
            "--workspace",
            default=None,
            help="local directory whose files the job runs with, as for `torchx run`"
            ' (default: the current directory; --workspace "" turns it off)',
        )
        where.add_argument(
            "--stall_timeout",
            type=float,
            default=None,
            metavar="S",
            help="fail the app when it neither prints a line nor reports progress for S seconds",
        )
        torchrun.add_arguments(subparser)

    def run(self, args: argparse.Namespace) -> None:
        from torchx.components.torchrun import COMPONENT, request_from_args
        from torchx.runner import config
        from torchx.runner.api import get_runner

        request = request_from_args(args)
        for note in request.ignored:
            print(f"torchx: note: torchrun {note}", file=sys.stderr)
        check_stall_timeout(args.stall_timeout)
        scheduler = args.scheduler or LOCAL
        workspace = resolve_workspace(args.workspace, config.get_configs("cli", "run"))
        with get_runner() as runner:
            runner.scheduler_run_opts(scheduler)  # an unknown scheduler fails here
            info = runner.dryrun_component(
                COMPONENT,
                request.component_args,
                scheduler,
                cfg=self._cfg(runner, scheduler, args),
                workspace=workspace,
                stall_timeout=args.stall_timeout,
            )
            if args.dryrun:
                self._print_dryrun(info)
                return
            foreground = scheduler == LOCAL or args.wait
            if scheduler == LOCAL and not request.no_python:
                check_script_exists(COMPONENT, request.component_args, workspace)
            handle = runner.schedule(info)
            if foreground:
                block_sigint()  # until the wait handles it
            print(handle, flush=True)
            if foreground:
                self._wait_and_stream(
                    runner, handle, stream=True, cancel_on_interrupt=True, own_sigint=True
                )
