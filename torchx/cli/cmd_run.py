"""``torchx run``: materialize a component and submit it; local apps are waited on and streamed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from torchx.cli.cmd_base import CommandError, SubCommand

_STDIN_FIELDS = {
    "component_name", "scheduler", "scheduler_args", "scheduler_cfg", "dryrun", "wait", "log",
    "workspace", "parent_run_id", "tee_logs", "component_args", "component_args_str",
}


class CmdRun(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("-s", "--scheduler", default=None, help="scheduler to run on (default: [cli:run] scheduler in .torchxconfig, else local_cwd)")
        subparser.add_argument("-cfg", "--scheduler_args", default=None, help="scheduler run options: KEY=VALUE[,KEY=VALUE...] (see `torchx runopts`)")
        subparser.add_argument("--dryrun", action="store_true", help="print the AppDef and the scheduler request without submitting")
        subparser.add_argument("--wait", action="store_true", help="wait for the app to finish (always on for local schedulers)")
        subparser.add_argument("--log", action="store_true", help="stream the app's logs (always on for local schedulers)")
        subparser.add_argument("--workspace", "--buck-target", default=None, help="accepted for compatibility; local_cwd runs in the current directory")
        subparser.add_argument("--parent_run_id", default=None, help="tracker run id of the parent (pipeline) run")
        subparser.add_argument("--tee_logs", action="store_true", help="stream the logs of every replica (same as --log)")
        subparser.add_argument("--stdin", action="store_true", help="read the run arguments as JSON from stdin")
        subparser.add_argument("component_name_and_args", nargs=argparse.REMAINDER, help="component name (builtin, or path/to/file.py:function) and its arguments")

    def run(self, args: argparse.Namespace) -> None:
        from torchx.runner import config, get_runner

        if args.stdin:
            self._apply_stdin(args)
        cli_defaults = config.get_configs("cli", "run")
        scheduler = args.scheduler or cli_defaults.get("scheduler") or "local_cwd"
        comp_and_args: List[Any] = list(args.component_name_and_args or [])
        if not comp_and_args:
            default_component = cli_defaults.get("component")
            if not default_component:
                raise CommandError("no component given; usage: torchx run [-s SCHEDULER] COMPONENT [ARGS...] (see `torchx builtins`)", 2)
            comp_and_args = [default_component]
        component, component_args = comp_and_args[0], comp_and_args[1:]

        with get_runner() as runner:
            if scheduler not in runner.scheduler_backends():
                from torchx.specs.api import UnknownSchedulerException

                raise UnknownSchedulerException(scheduler, sorted(runner.scheduler_backends()))
            cfg: Dict[str, Any] = getattr(args, "_stdin_cfg", None) or {}
            if args.scheduler_args:
                cfg.update(runner.cfg_from_str(scheduler, args.scheduler_args))
            if component_args in (["--help"], ["-h"]) or "--help" in component_args[:1]:
                self._print_help(component)
                return
            try:
                info = runner.dryrun_component(component, component_args, scheduler, cfg=cfg, parent_run_id=args.parent_run_id)
            except Exception as e:
                from torchx.specs.builders import is_help_request

                text = is_help_request(e)
                if text is None:
                    raise
                print(text)
                return
            if args.dryrun:
                self._print_dryrun(info)
                return
            handle = runner.schedule(info)
            print(handle, flush=True)
            local = scheduler.startswith("local")
            if local or args.wait or args.log or args.tee_logs:
                self._wait_and_stream(runner, handle, stream=local or args.log or args.tee_logs)

    def _print_help(self, component: str) -> None:
        from torchx.runner import config
        from torchx.specs.builders import component_help
        from torchx.specs.finder import get_component

        print(component_help(get_component(component).fn, config.get_configs("component", component)))

    def _print_dryrun(self, info: Any) -> None:
        import pprint

        from torchx.specs.serialize import appdef_to_dict

        print("=== APPLICATION ===")
        print(pprint.pformat(appdef_to_dict(info._app), width=100, sort_dicts=False))
        print("=== SCHEDULER REQUEST ===")
        print(repr(info))

    def _wait_and_stream(self, runner: Any, handle: str, stream: bool) -> None:
        from torchx.cli.logs import replicas_of, stream_logs

        try:
            if stream:
                stream_logs(runner, handle, replicas_of(runner, handle), should_tail=True)
            status = runner.wait(handle, wait_interval=1)
        except KeyboardInterrupt:
            print(f"torchx: interrupted; cancelling {handle}", file=sys.stderr)
            runner.cancel(handle)
            runner.wait(handle, wait_interval=1, timeout=30)
            raise
        if status is None:
            raise CommandError(f"app {handle} disappeared from its scheduler")
        if status.state.name != "SUCCEEDED":
            raise CommandError(f"{handle} {status.error_summary()}")

    def _apply_stdin(self, args: argparse.Namespace) -> None:
        if args.component_name_and_args or args.scheduler or args.scheduler_args or args.dryrun:
            raise CommandError("--stdin takes all run arguments from the JSON on stdin; give no other flags", 2)
        try:
            data = json.load(sys.stdin)
        except ValueError as e:
            raise CommandError(f"--stdin: invalid JSON: {e}", 2) from None
        if not isinstance(data, dict):
            raise CommandError("--stdin: expected a JSON object", 2)
        unknown = set(data) - _STDIN_FIELDS
        if unknown:
            raise CommandError(f"--stdin: unknown field(s) {', '.join(sorted(unknown))}", 2)
        if "component_name" not in data:
            raise CommandError("--stdin: 'component_name' is required", 2)
        comp_args: Optional[List[str]] = data.get("component_args_str")
        if comp_args is None and isinstance(data.get("component_args"), dict):
            comp_args = [f"--{k}={v}" for k, v in data["component_args"].items()]
        args.component_name_and_args = [data["component_name"], *(comp_args or data.get("component_args") or [])]
        args.scheduler = data.get("scheduler")
        args.scheduler_args = data.get("scheduler_args")
        args._stdin_cfg = dict(data.get("scheduler_cfg") or {})
        for flag in ("dryrun", "wait", "log", "tee_logs"):
            setattr(args, flag, bool(data.get(flag, False)))
        args.parent_run_id = data.get("parent_run_id")
