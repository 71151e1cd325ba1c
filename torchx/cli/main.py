"""The ``torchx`` command. Verb modules are imported only when their verb runs."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Dict, List, Optional

from torchx.cli.cmd_base import CommandError, SubCommand

# verb -> (module, class, one-line help)
BUILTIN_VERBS: Dict[str, tuple[str, str, str]] = {
    "builtins": ("torchx.cli.cmd_builtins", "CmdBuiltins", "list the builtin components"),
    "cancel": ("torchx.cli.cmd_cancel", "CmdCancel", "cancel a running app"),
    "configure": ("torchx.cli.cmd_configure", "CmdConfigure", "write a .torchxconfig with scheduler options"),
    "describe": ("torchx.cli.cmd_describe", "CmdDescribe", "show the AppDef of a submitted app"),
    "list": ("torchx.cli.cmd_list", "CmdList", "list the apps of a scheduler"),
    "log": ("torchx.cli.cmd_log", "CmdLog", "print or follow an app's logs"),
    "run": ("torchx.cli.cmd_run", "CmdRun", "run a component on a scheduler"),
    "runopts": ("torchx.cli.cmd_runopts", "CmdRunopts", "list the run options (-cfg) of schedulers"),
    "status": ("torchx.cli.cmd_status", "CmdStatus", "show the status of an app"),
    "tracker": ("torchx.cli.cmd_tracker", "CmdTracker", "show tracked runs, artifacts and lineage"),
}

logger = logging.getLogger("torchx.cli")


def _load_verb(module: str, cls: str) -> Optional[SubCommand]:
    try:
        return getattr(importlib.import_module(module), cls)()
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def _plugin_verbs() -> Dict[str, SubCommand]:
    from torchx.util.entrypoints import entry_point_names, load_group

    if not entry_point_names("torchx.cli.cmds"):
        return {}
    return {name: loader()() for name, loader in load_group("torchx.cli.cmds").items()}


def create_parser(argv: List[str]) -> tuple[argparse.ArgumentParser, Dict[str, SubCommand]]:
    from torchx import __version__

    parser = argparse.ArgumentParser(
        prog="torchx",
        description="torchx: launch PyTorch apps on any scheduler (local, Slurm, Kubernetes, AWS Batch, Ray)",
    )
    parser.add_argument(
        "--log_level",
        default=None,
        help="python logging level (debug, info, warning); debug also shows tracebacks",
    )
    parser.add_argument("--version", action="version", version=f"torchx {__version__}")
    sub = parser.add_subparsers(title="sub-commands", dest="subcmd", metavar="{" + ",".join(sorted(BUILTIN_VERBS)) + "}")
    # Only the verb being run is imported: `torchx --help` stays fast.
    chosen = _verb_of(argv)
    verbs: Dict[str, SubCommand] = {}
    for name in sorted(BUILTIN_VERBS):
        module, cls, help_text = BUILTIN_VERBS[name]
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            cmd = _load_verb(module, cls)
            if cmd is not None:
                cmd.add_arguments(subparser)
                verbs[name] = cmd
    if chosen and chosen not in BUILTIN_VERBS:
        plugins = _plugin_verbs()
        if chosen in plugins:
            plugin: SubCommand = plugins[chosen]  # type: ignore[assignment]
            plugin.add_arguments(sub.add_parser(chosen))
            verbs[chosen] = plugin
    return parser, verbs


def _verb_of(argv: List[str]) -> Optional[str]:
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--log_level":
            skip = True
        elif not a.startswith("-"):
            return a
    return None


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.WARNING),
        format="torchx %(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )


def run_main(argv: List[str]) -> int:
    parser, verbs = create_parser(argv)
    args = parser.parse_args(argv)
    level = args.log_level or os.environ.get("LOGLEVEL") or "WARNING"
    debug = level.lower() == "debug"
    _setup_logging(level)
    if not args.subcmd:
        parser.print_help()
        return 1
    if args.subcmd not in verbs:
        print(f"torchx: error: the {args.subcmd} command is not available in this install", file=sys.stderr)
        return 1
    try:
        verbs[args.subcmd].run(args)
        return 0
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    except KeyboardInterrupt:
        print("torchx: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:
        if debug:
            raise
        return _report(e)


def _report(e: Exception) -> int:
    from torchx.specs.api import TorchXError
    from torchx.util.modules import MissingExtraError

    if isinstance(e, CommandError):
        print(f"torchx: error: {e}", file=sys.stderr)
        return e.exit_code
    if isinstance(e, (TorchXError, MissingExtraError)):
        message = " ".join(str(e).split("\n")[0].split()) or type(e).__name__
        print(f"torchx: error: {message}", file=sys.stderr)
        return 1
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    print(
        f"torchx: error: {type(e).__name__}: {first} (rerun with --log_level debug for the traceback)",
        file=sys.stderr,
    )
    return 1


def main(argv: Optional[List[str]] = None) -> None:
    sys.exit(run_main(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
