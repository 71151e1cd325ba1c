"""``torchx.runner`` must not import its own submodules at package import.

Such a package is an import cycle (``torchx.runner`` -> ``.api`` -> ``torchx.runner.config``),
and threads that first-import it at once got ``KeyError('torchx.runner')`` or a partially
initialized ``torchx.runner.api`` (4 of 60 runs of three threads importing ``get_runner``,
``torchx.pipelines.core`` and ``torchx.runner.logs``, with a 1 us switch interval).
"""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_importing_the_package_imports_no_submodule() -> None:
    out = _run("import sys, torchx.runner; print('torchx.runner.api' in sys.modules)")
    assert out == "False"


def test_upstream_names_still_import_from_the_package() -> None:
    out = _run(
        "from torchx.runner import Runner, get_runner\n"
        "import torchx.runner as r\n"
        "print(Runner is r.Runner, get_runner.__module__)"
    )
    assert out == "True torchx.runner.api"
