"""``torchx describe HANDLE``: the AppDef the app was submitted with."""

from __future__ import annotations

import argparse

from torchx.cli.cmd_base import SubCommand, no_such_app


class CmdDescribe(SubCommand):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("app_handle", help="torchx app handle")

    def run(self, args: argparse.Namespace) -> None:
        import yaml

        from torchx.runner.api import get_runner
        from torchx.specs.serialize import appdef_to_dict

        with get_runner() as runner:
            app = runner.describe(args.app_handle)
        if app is None:
            raise no_such_app(args.app_handle)
        from torchx.runner.tracking import hide_sensitive

        for role in app.roles:  # a job's env may carry credentials (MLFLOW_TRACKING_PASSWORD)
            role.env = {k: str(hide_sensitive(k, v)) for k, v in role.env.items()}
        print(yaml.safe_dump(appdef_to_dict(app), sort_keys=False, width=100).rstrip())
