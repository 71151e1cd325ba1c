"""``torchx builtins``: the components available by name."""

from __future__ import annotations

import argparse

from torchx.cli.cmd_base import SubCommand


class CmdBuiltins(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument(
            "--print",
            dest="print_name",
            default=None,
            metavar="NAME",
            help="print the source of a builtin component",
        )

    def run(self, args: argparse.Namespace) -> None:
        from torchx.specs.finder import get_builtin_source, get_components

        if args.print_name:
            print(get_builtin_source(args.print_name))
            return
        components = get_components()
        print(f"Found {len(components)} builtin components:")
        for i, name in enumerate(sorted(components), 1):
            # upstream's description may run to several lines: its first is the summary
            summary = (components[name].description or "").strip().splitlines() or [""]
            print(f"{i:3d}. {name:<22} {summary[0]}")
