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
        from torchx.cli.masking import masker
        from torchx.specs.secrets import mask_args, mask_env

        for role in app.roles:  # a job's env may carry credentials (MLFLOW_TRACKING_PASSWORD)
            masker().add_env(role.env)
            role.env = mask_env(role.env)
            role.args = [str(a) for a in mask_args(list(role.args))]
        print(yaml.safe_dump(appdef_to_dict(app), sort_keys=False, width=100).rstrip())
