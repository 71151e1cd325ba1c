"""The ``torchx`` command.

Startup is kept cheap on purpose: only the verb being run has its module imported
(upstream imports every verb, the runner and all schedulers before printing ``--help``).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
from typing import Any, Callable, Dict, List, NoReturn, Optional

from torchx.cli.cmd_base import CommandError, SubCommand

# verb -> its one-line help; verb ``x`` is the class ``CmdX`` of ``torchx.cli.cmd_x``
BUILTIN_VERBS: Dict[str, str] = {
    "builtins": "list the builtin components",
    "cancel": "cancel a running app",
    "configure": "write a .torchxconfig with scheduler options",
    "describe": "show the AppDef of a submitted app",
    "list": "list the apps of a scheduler",
    "log": "print or follow an app's logs",
    "reap": "cancel live apps whose owner task has ended",
    "run": "run a component on a scheduler",
    "runopts": "list the run options (-cfg) of schedulers",
    "status": "show the status of an app",
    "torchrun": "run a torchrun command line (torchrun's own flags) as a dist.ddp app"
    " on any scheduler",
    "tracker": "show tracked runs, artifacts and lineage",
}

PLUGIN_GROUP = "torchx.cli.cmds"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

logger = logging.getLogger("torchx.cli")


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (plus where to look), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _load_verb(module: str, cls: str) -> Optional[SubCommand]:
    try:
        return getattr(importlib.import_module(module), cls)()
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def _declares_plugin_verbs() -> bool:
    """Does any installed distribution declare ``[torchx.cli.cmds]``? A raw scan (a few ms):
    ``importlib.metadata.entry_points`` (30-80 ms) runs only when it finds the group."""
    marker = f"[{PLUGIN_GROUP}]".encode()
    for d in sys.path:
        try:
            entries = list(os.scandir(d or "."))
        except OSError:
            continue
        for e in entries:
            if e.name.endswith((".dist-info", ".egg-info")):
                path = os.path.join(e.path, "entry_points.txt")
            elif e.name.endswith(".egg"):
                path = os.path.join(e.path, "EGG-INFO", "entry_points.txt")
            else:
                continue
            try:
                with open(path, "rb") as f:
                    if marker in f.read():
                        return True
            except OSError:
                continue
    return False


def plugin_verbs() -> Dict[str, Callable[[], SubCommand]]:
    """``{verb: SubCommand class}`` registered in the ``torchx.cli.cmds`` entry-point group."""
    if not _declares_plugin_verbs():
        return {}
    from torchx.util.entrypoints import load_group

    def instantiate(loader: Callable[[], Any]) -> Callable[[], SubCommand]:
        return lambda: loader()()

    return {name: instantiate(loader) for name, loader in load_group(PLUGIN_GROUP).items()}


def create_parser(argv: List[str]) -> tuple[argparse.ArgumentParser, Dict[str, SubCommand]]:
    """The parser; only the verb named in ``argv`` gets its arguments (and module) loaded."""
    from torchx import __version__

    plugins = plugin_verbs()
    names = sorted(set(BUILTIN_VERBS) | set(plugins))
    parser = _Parser(
        prog="torchx",
        description="torchx: launch PyTorch apps on any scheduler"
        " (local, Slurm, Kubernetes, AWS Batch, Ray)",
    )
    parser.add_argument(
        "--log_level",
        default=None,
        type=str.lower,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        help="python logging level: debug, info, warning (default: $LOGLEVEL, else warning);"
        " debug also shows tracebacks",
    )
    parser.add_argument("--version", action="version", version=f"torchx {__version__}")
    sub = parser.add_subparsers(
        title="sub-commands", dest="subcmd", metavar="{" + ",".join(names) + "}"
    )
    chosen = _verb_of(argv)
    parser.set_defaults(_verb_parser=parser)  # the chosen verb's parser, once it is added
    verbs: Dict[str, SubCommand] = {}
    # a known verb gets the only sub-parser (each costs ~1 ms of argparse set-up, and the
    # usage line already lists every verb); else all, for the help and the error message
    for name in [n for n in names if n == chosen] or names:
        help_text = BUILTIN_VERBS.get(name, f"(plugin) {name}")
        if name != chosen:
            sub.add_parser(name, help=help_text, description=help_text)
            continue
        cmd: Optional[SubCommand]
        if name in plugins:  # a plugin of the same name replaces the builtin verb
            cmd = plugins[name]()
        else:
            cmd = _load_verb(f"torchx.cli.cmd_{name}", f"Cmd{name.capitalize()}")
        add_help = cmd is None or cmd.add_help
        subparser = sub.add_parser(name, help=help_text, description=help_text, add_help=add_help)
        parser.set_defaults(_verb_parser=subparser)
        if cmd is not None:
            cmd.add_arguments(subparser)
            verbs[name] = cmd
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


def run_main(argv: List[str]) -> int:
    """Parse ``argv``, run the verb, map errors to one stderr line and an exit code; what
    it prints is masked (``torchx.cli.masking``)."""
    from torchx.cli.masking import masked_output

    with masked_output(argv):
        return _run(argv)


def _run(argv: List[str]) -> int:
    debug = False
    try:
        parser, verbs = create_parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the verb's parser, so the hint names `torchx VERB --help`
            args._verb_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        level = args.log_level or os.environ.get("LOGLEVEL", "").lower() or "warning"
        debug = level == "debug"
        logging.basicConfig(
            level=getattr(logging, level.upper(), logging.WARNING),
            format="torchx %(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )
        if not args.subcmd:
            parser.print_help()
            return 1
        if args.subcmd not in verbs:
            print(
                f"torchx: error: the {args.subcmd} command is not available in this install",
                file=sys.stderr,
            )
            return 1
        verbs[args.subcmd].run(args)
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("torchx: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`torchx log ... | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # any failure is one line (the traceback with --log_level debug)
        if debug:
            raise
        return _report(e)


def _report(e: Exception) -> int:
    from torchx.specs.api import TorchXError
    from torchx.util.modules import MissingExtraError
    from torchx.util.paths import UnsafeStateRootError

    if isinstance(e, CommandError):
        print(f"torchx: error: {e}", file=sys.stderr)
        return e.exit_code
    if isinstance(e, (TorchXError, MissingExtraError, UnsafeStateRootError)):
        message = " ".join(str(e).split("\n")[0].split()) or type(e).__name__
        print(f"torchx: error: {message}", file=sys.stderr)
        return 1
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    print(
        f"torchx: error: {type(e).__name__}: {first}"
        " (rerun with --log_level debug for the traceback)",
        file=sys.stderr,
    )
    return 1


def main(argv: Optional[List[str]] = None) -> None:
    """Console script ``torchx``."""
    code = run_main(sys.argv[1:] if argv is None else argv)
    # the interpreter's teardown runs full garbage collections (4-50 ms, about 20% of a dry
    # run's CPU); frozen objects are skipped, and only cycles (argparse's parsers, the closed
    # Runner; no finalizers) are left uncollected
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()
