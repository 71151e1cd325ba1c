"""``backend_errors()``: a backend's failures are caught, a bug is not, and naming a
client's errors imports no client."""

from __future__ import annotations

import subprocess
import sys

from torchx.specs.errors import backend_errors
from torchx.trackers.api import TrackerConfigError


def test_a_backends_failure_is_caught_and_a_bug_is_not() -> None:
    for failure in (ConnectionRefusedError(), TrackerConfigError("x"), KeyError("x")):
        assert isinstance(failure, backend_errors())
    for bug in (TypeError(), AttributeError(), NameError()):
        assert not isinstance(bug, backend_errors())


def test_a_clients_errors_count_once_it_is_loaded_and_load_nothing() -> None:
    code = (
        "import sys\n"
        "from torchx.specs.errors import backend_errors\n"
        "before = {e.__name__ for e in backend_errors()}\n"
        "assert 'mlflow' not in sys.modules and 'MlflowException' not in before, before\n"
        "from mlflow.exceptions import MlflowException\n"
        "assert MlflowException in backend_errors()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
