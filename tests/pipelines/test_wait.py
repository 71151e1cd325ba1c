"""``core.wait_or_cancel``'s progress reads, as the operator and the Prefect task use it."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pytest

from torchx.components.utils import sh
from torchx.pipelines import core
from torchx.runner import get_runner
from torchx.runtime.progress import Progress


def test_a_zero_progress_interval_reads_at_the_default_pace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``progress_interval=0`` means the default interval (as it did for the operator and the
    Prefect task), not a loop that reads the report without pause while the app runs."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path))
    with get_runner(trackers={}) as runner:
        reads: List[str] = []
        read = runner.progress

        def counted(handle: str) -> Optional[Progress]:
            reads.append(handle)
            return read(handle)

        monkeypatch.setattr(runner, "progress", counted)
        handle = runner.run(sh("sleep", "2"), "local_cwd")
        core.wait_or_cancel(runner, handle, 0.2, on_progress=lambda _: None, progress_interval=0)
    assert 1 <= len(reads) <= 3, f"{len(reads)} progress reads in a 2 s wait"
