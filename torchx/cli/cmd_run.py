"""``torchx run``: materialize a component and submit it; local apps are waited on and streamed.

Heavy modules are imported inside ``run`` so that building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any, Dict, List, Mapping, Optional, Union

from torchx.cli.cmd_base import CommandError, SubCommand

logger = logging.getLogger(__name__)

_STDIN_FIELDS = set(
    "component_name component_args component_args_str scheduler scheduler_args scheduler_cfg"
    " dryrun wait log workspace parent_run_id tee_logs stall_timeout".split()
)


class _Terminated(BaseException):
    """SIGTERM while waiting on an app: handled like Ctrl-C."""


class CmdRun(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "-s",
            "--scheduler",
            default=None,
            help="scheduler to run on"
            " (default: [cli:run] scheduler in .torchxconfig, else local_cwd)",
        )
        add_cfg_argument(subparser)
        subparser.add_argument(
            "--dryrun",
            action="store_true",
            help="print the AppDef and the scheduler request without submitting",
        )
        subparser.add_argument(
            "--wait",
            action="store_true",
            help="wait for the app to finish (always on for local schedulers)",
        )
        subparser.add_argument(
            "--log",
            action="store_true",
            help="stream the app's logs (always on for local schedulers)",
        )
        subparser.add_argument(
            "--workspace",
            "--buck-target",
            default=None,
            help="local directory whose files the job runs with: copied into the job's"
            " directory (local_cwd, slurm with -cfg job_dir) or built into an image on top of"
            " the role's image and pushed to image_repo (kubernetes, aws_batch)."
            " Default: [cli:run] workspace in .torchxconfig, else the current directory;"
            ' --workspace "" turns it off',
        )
        subparser.add_argument(
            "--parent_run_id", default=None, help="tracker run id of the parent (pipeline) run"
        )
        subparser.add_argument(
            "--tee_logs",
            action="store_true",
            help="stream the logs of every replica (same as --log)",
        )
        subparser.add_argument(
            "--stall_timeout",
            type=float,
            default=None,
            metavar="S",
            help="fail the app (and stop all its processes) when it neither prints a line nor"
            " reports progress (torchx.trackers.report_progress) for S seconds; a watchdog"
            " runs with the job (in containers: the image needs torchx, as torchx's own has)",
        )
        subparser.add_argument(
            "--stdin", action="store_true", help="read the run arguments as JSON from stdin"
        )
        subparser.set_defaults(stdin_args_dict=None, stdin_cfg=None)  # what --stdin sets
        subparser.add_argument(
            "component_name_and_args",
            nargs=argparse.REMAINDER,
            help="component name (builtin, or path/to/file.py:function) and its arguments",
        )

    def run(self, args: argparse.Namespace) -> None:
        from torchx.runner import config
        from torchx.runner.api import get_runner
        from torchx.specs.builders import ComponentHelpRequest, component_help
        from torchx.specs.finder import get_component

        if args.stdin:
            self._apply_stdin(args)
        cli_defaults = config.get_configs("cli", "run")
        scheduler = args.scheduler or cli_defaults.get("scheduler") or "local_cwd"
        comp_and_args: List[Any] = list(args.component_name_and_args or [])
        if not comp_and_args:
            default_component = cli_defaults.get("component")
            if not default_component:
                raise CommandError(
                    "no component given; usage: torchx run [-s SCHEDULER] COMPONENT [ARGS...]"
                    " (see `torchx builtins`)",
                    2,
                )
            comp_and_args = [default_component]
        component = comp_and_args[0]
        component_args: Union[List[str], Dict[str, Any]] = args.stdin_args_dict or comp_and_args[1:]
        workspace = resolve_workspace(args.workspace, cli_defaults)
        check_stall_timeout(args.stall_timeout)

        with get_runner() as runner:
            runner.scheduler_run_opts(scheduler)  # an unknown scheduler fails here
            cfg = self._cfg(runner, scheduler, args, args.stdin_cfg)
            if isinstance(component_args, list) and component_args[:1] in (["--help"], ["-h"]):
                defaults = config.get_configs("component", component)
                print(component_help(get_component(component).fn, defaults))
                return
            try:
                info = runner.dryrun_component(
                    component,
                    component_args,
                    scheduler,
                    cfg=cfg,
                    workspace=workspace,
                    parent_run_id=args.parent_run_id,
                    stall_timeout=args.stall_timeout,
                )
            except ComponentHelpRequest as e:
                print(e.text)
                return
            if args.dryrun:
                self._print_dryrun(info)
                return
            local = scheduler.startswith("local")
            if local:
                check_script_exists(component, component_args, workspace)
            handle = runner.schedule(info)
            print(handle, flush=True)
            if local or args.wait or args.log or args.tee_logs:
                self._wait_and_stream(
                    runner,
                    handle,
                    stream=local or args.log or args.tee_logs,
                    cancel_on_interrupt=local,
                )

    def _cfg(
        self,
        runner: Any,
        scheduler: str,
        args: argparse.Namespace,
        given: Optional[Mapping[str, Any]] = None,
    ) -> Dict[str, Any]:
        """``-cfg`` options on top of ``given`` (``--stdin``'s); a key given twice differently is
        an error."""
        cfg: Dict[str, Any] = dict(given or {})
        for literal in args.scheduler_args or []:
            for key, value in runner.cfg_from_str(scheduler, literal).items():
                if key in cfg and cfg[key] != value:
                    raise CommandError(
                        f"-cfg {key} given twice ({cfg[key]!r} and {value!r}); give it once", 2
                    )
                cfg[key] = value
        return cfg

    def _print_dryrun(self, info: Any) -> None:
        import pprint

        from torchx.specs.serialize import appdef_to_dict

        print("=== APPLICATION ===")
        print(pprint.pformat(appdef_to_dict(info.app), width=100, sort_dicts=False))
        print("=== SCHEDULER REQUEST ===")
        print(repr(info))
        if info.workspace is not None:
            print("=== WORKSPACE ===")
            print(info.workspace)

    def _wait_and_stream(
        self,
        runner: Any,
        handle: str,
        stream: bool,
        cancel_on_interrupt: bool,
        own_sigint: bool = False,
    ) -> None:
        """Stream (optionally) and wait; Ctrl-C/SIGTERM cancel a local app, else stop watching.

        ``own_sigint``: SIGINT raises ``KeyboardInterrupt`` for the wait even when this process
        started with it ignored (a shell's background job: ``torchx torchrun ... &``), as
        plain torchrun handles it; the caller blocked SIGINT (``block_sigint``) once the app
        was submitted, and one sent since is handled here. Restored when the wait ends.
        """
        from torchx.cli.logs import stream_logs
        from torchx.runner.logs import replicas_of

        def on_term(signum: int, frame: Any) -> None:
            raise _Terminated()

        previous = signal.signal(signal.SIGTERM, on_term)
        previous_int = (
            signal.signal(signal.SIGINT, signal.default_int_handler) if own_sigint else None
        )
        try:
            try:
                if own_sigint:  # one sent since the submission raises here, in the try
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                if stream:
                    errors = stream_logs(
                        runner, handle, replicas_of(runner, handle), should_tail=True
                    )
                    for err in errors:
                        print(f"torchx: warning: could not read logs: {err}", file=sys.stderr)
                status = runner.wait(handle, wait_interval=1)
            except (KeyboardInterrupt, _Terminated) as e:
                code = 130 if isinstance(e, KeyboardInterrupt) else 143
                if not cancel_on_interrupt:
                    raise CommandError(
                        f"interrupted; {handle} keeps running"
                        f" (stop it with `torchx cancel {handle}`)",
                        code,
                    ) from None
                # a second Ctrl-C must not abort the cancel
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                try:
                    runner.cancel(handle)
                    final = runner.wait(handle, wait_interval=1, timeout=30)
                finally:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                state = final.state if final else "UNKNOWN"
                raise CommandError(f"interrupted; cancelled {handle} ({state})", code) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
            if previous_int is not None:
                signal.signal(signal.SIGINT, previous_int)
        if status is None:
            raise CommandError(f"app {handle} disappeared from its scheduler")
        if status.state.name != "SUCCEEDED":
            raise CommandError(f"{handle} {status.error_summary()}")

    def _apply_stdin(self, args: argparse.Namespace) -> None:
        flags = (args.component_name_and_args, args.scheduler, args.scheduler_args, args.dryrun)
        if any(flags) or args.wait or args.log or args.workspace is not None:
            raise CommandError(
                "--stdin takes all run arguments from the JSON on stdin; give no other flags", 2
            )
        try:
            data = json.load(sys.stdin)
        except ValueError as e:
            raise CommandError(f"--stdin: invalid JSON: {e}", 2) from None
        if not isinstance(data, dict):
            raise CommandError("--stdin: expected a JSON object", 2)
        unknown = set(data) - _STDIN_FIELDS
        if unknown:
            raise CommandError(f"--stdin: unknown field(s) {', '.join(sorted(unknown))}", 2)
        if not data.get("component_name"):
            raise CommandError("--stdin: 'component_name' is required", 2)
        comp_args = data.get("component_args_str")
        if comp_args is None:
            comp_args = data.get("component_args") or []
        if isinstance(comp_args, dict):
            args.stdin_args_dict = comp_args  # typed values, passed to the component as is
            comp_args = []
        if not isinstance(comp_args, list):
            raise CommandError(
                "--stdin: 'component_args' must be a list of strings or an object", 2
            )
        args.component_name_and_args = [data["component_name"], *[str(a) for a in comp_args]]
        args.scheduler = data.get("scheduler")
        sched_args = data.get("scheduler_args")
        args.scheduler_args = [sched_args] if isinstance(sched_args, str) and sched_args else None
        args.stdin_cfg = dict(data.get("scheduler_cfg") or {})
        for flag in ("dryrun", "wait", "log", "tee_logs"):
            setattr(args, flag, bool(data.get(flag, False)))
        args.parent_run_id = data.get("parent_run_id")
        stall = data.get("stall_timeout")
        args.stall_timeout = float(stall) if isinstance(stall, (int, float)) and stall else None
        args.workspace = data.get("workspace")


def block_sigint() -> None:
    """Hold SIGINT until ``_wait_and_stream(own_sigint=True)`` handles it (call it right
    after the submission, before the handle is printed: a script that reads the handle and
    sends SIGINT at once stops the app)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def add_cfg_argument(parser: Any) -> None:
    """``-cfg``, as ``torchx run`` and ``torchx torchrun`` take it."""
    parser.add_argument(
        "-cfg",
        "--scheduler_args",
        action="append",
        default=None,
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="scheduler run options (see `torchx runopts SCHEDULER`); may be repeated",
    )


def check_stall_timeout(stall_timeout: Optional[float]) -> None:
    if stall_timeout is not None and not stall_timeout > 0:
        raise CommandError(f"--stall_timeout {stall_timeout:g}: give a number of seconds > 0", 2)


def resolve_workspace(flag: Optional[str], cli_defaults: Dict[str, str]) -> Optional[str]:
    """The workspace to pass to the Runner: ``--workspace``, else ``[cli:run] workspace``,
    else the current directory (``file://$PWD``, as upstream); ``""`` means none.
    """
    if flag is None:
        flag = cli_defaults.get("workspace")
    if flag is None:
        flag = f"file://{os.getcwd()}"
    return flag or None


def _local_dir(workspace: Optional[str]) -> str:
    """The directory a local job runs in: a local ``workspace``, else the current one."""
    if workspace:
        path = workspace[len("file://") :] if workspace.startswith("file://") else workspace
        if "://" not in path and os.path.isdir(path):
            return os.path.abspath(path)
    return os.getcwd()


def check_script_exists(
    component: str,
    component_args: Union[List[str], Dict[str, Any]],
    workspace: Optional[str] = None,
) -> None:
    """A local app whose ``--script`` file is missing fails now, not after the workers start
    (upstream reports it only after several seconds of worker start-up)."""
    import inspect

    from torchx.runner import config
    from torchx.specs.builders import component_args_from_str
    from torchx.specs.finder import get_component

    fn = get_component(component).fn
    if "script" not in inspect.signature(fn).parameters:
        return
    defaults = config.get_configs("component", component)
    if isinstance(component_args, dict):
        parsed = component_args_from_str(fn, [], defaults, config=component_args)
    else:
        parsed = component_args_from_str(fn, list(component_args), defaults)
    script: Optional[str] = parsed.positional_args.get("script", parsed.kwargs.get("script"))
    if not script or "$" in script:
        return
    where = _local_dir(workspace)
    if not os.path.isfile(os.path.join(where, script)):
        raise CommandError(
            f"--script {script}: no such file in {where}"
            " (local schedulers run in the workspace, by default the current directory)"
        )
