"""The one Kubernetes-quantity parser: decimal and binary suffixes, exponents, bad input."""

from __future__ import annotations

from decimal import Decimal

import pytest

from torchx.util.quantity import (
    InvalidQuantityError,
    cpu_cores,
    cpu_whole_cores,
    memory_mib,
    parse_quantity,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8G", 7629),  # 8e9 bytes
        ("8Gi", 8192),
        ("512Mi", 512),
        ("1M", 0),  # 1e6 bytes < 1 MiB: rounded down
        ("1000M", 953),
        ("1Ti", 1024 * 1024),
        ("1T", 953674),
        ("1048576", 1),  # a plain number is bytes
        ("2097152", 2),
        ("1536Ki", 1),
        ("1.5Gi", 1536),
        ("12e6", 11),
        ("1E9", 953),
        ("0", 0),
        (1073741824, 1024),
        ("  4Gi ", 4096),
    ],
)
def test_memory_mib(text: str, expected: int) -> None:
    assert memory_mib(text) == expected


@pytest.mark.parametrize(
    "text, cores, whole",
    [
        ("500m", 0.5, 1),
        ("2", 2.0, 2),
        ("2000m", 2.0, 2),
        ("1500m", 1.5, 2),  # rounded up: never less than asked
        ("2500m", 2.5, 3),
        ("0.25", 0.25, 1),
        ("100u", 0.0001, 1),
        ("1k", 1000.0, 1000),
        (4, 4.0, 4),
        (0.5, 0.5, 1),
    ],
)
def test_cpu(text: str, cores: float, whole: int) -> None:
    assert cpu_cores(text) == pytest.approx(cores)
    assert cpu_whole_cores(text) == whole


def test_values_are_exact() -> None:
    assert parse_quantity("8G") == Decimal(8_000_000_000)
    assert parse_quantity("8Gi") == Decimal(8 * 2**30)
    assert parse_quantity("1.1") == Decimal("1.1")
    assert parse_quantity("3m") == Decimal("0.003")
    assert parse_quantity("1e-3") == Decimal("0.001")
    assert parse_quantity("+5k") == Decimal(5000)


@pytest.mark.parametrize(
    "bad", ["", "G", "8 Gi", "8gi", "8GB", "1.2.3", "abc", "0x10", "1e", "Gi8", "1e1000", True]
)
def test_bad_quantities_are_one_clear_error(bad: object) -> None:
    with pytest.raises(InvalidQuantityError) as e:
        parse_quantity(bad, "memory limit")  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith("memory limit ")
    assert "\n" not in str(e.value)


def test_negative_and_non_finite_are_refused() -> None:
    with pytest.raises(InvalidQuantityError, match="negative"):
        memory_mib("-1Gi")
    with pytest.raises(InvalidQuantityError, match="negative"):
        cpu_cores("-500m")
    with pytest.raises(InvalidQuantityError, match="finite"):
        cpu_cores(float("inf"))
