"""The trigger's threads (status, log readers) must never first-import torchx.

Two threads first-importing ``torchx.runner`` at once can see a partially initialized module:
in a loaded triggerer a trigger failed with ``ImportError: cannot import name 'Runner' from
partially initialized module 'torchx.runner.api'`` and its task failed ("Trigger failure").
So the trigger module imports what its threads use, in the triggerer's loop thread.
"""

from __future__ import annotations

import json
import subprocess
import sys

THREADS_USE = ["torchx.runner.api", "torchx.runner.logs", "torchx.pipelines.core"]


def test_the_trigger_module_imports_what_its_threads_use() -> None:
    code = (
        "import json, sys\n"
        "import torchx.pipelines.airflow.trigger\n"
        f"print(json.dumps([m for m in {THREADS_USE!r} if m not in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []
