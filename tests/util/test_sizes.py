"""Size limits that keep the code one can hold in one's head (DESIGN: files under ~600
lines; issue 24: tracking in at most 1,600; issue 37 added MLflow's client settings, its
typed store protocol and the checked schema revisions: 1,900)."""

from __future__ import annotations

from pathlib import Path

TORCHX = Path(__file__).resolve().parents[2] / "torchx"


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_600_lines() -> None:
    over = {str(p.relative_to(TORCHX)): lines(p) for p in TORCHX.rglob("*.py") if lines(p) > 600}
    assert over == {}


def test_tracking_is_at_most_1900_lines() -> None:
    assert sum(lines(p) for p in (TORCHX / "trackers").glob("*.py")) <= 1900
