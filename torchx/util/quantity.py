"""Kubernetes resource quantities (``500m``, ``8Gi``, ``8G``, ``1e3``), the one parser for
every place that reads one, so ``8G`` means the same everywhere (8e9 bytes)."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Union

MIB = 2**20

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?$"
)

_MAX_EXPONENT = 100  # Kubernetes itself caps quantities far below 1e100

Quantity = Union[str, int, float]


class InvalidQuantityError(ValueError):
    """A value that is not a Kubernetes quantity (a ``ValueError``: helpers know no data
    model, so not a ``torchx.specs`` error; callers that face users say what was wrong)."""


def parse_quantity(value: Quantity, what: str = "quantity") -> Decimal:
    """The exact value of a quantity in base units (cores, bytes): ``"500m"`` -> 0.5."""
    if isinstance(value, bool):
        raise InvalidQuantityError(f"{what} {value!r} is not a number")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidQuantityError(f"{what} {value!r} is not a finite number")
        return Decimal(str(value))
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise InvalidQuantityError(
            f"{what} {value!r} is not a Kubernetes quantity;"
            " use a number with an optional suffix, e.g. 500m, 2, 512Mi, 8Gi or 8G"
        )
    suffix = m["suffix"] or ""
    try:
        num = Decimal(m["num"])
        if m["exp"] is not None:
            exp = int(m["exp"])
            if abs(exp) > _MAX_EXPONENT:
                raise InvalidOperation
            return num.scaleb(exp)
        return num * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])
    except (InvalidOperation, ArithmeticError):
        raise InvalidQuantityError(f"{what} {value!r} is out of range") from None


def cpu_cores(value: Quantity) -> float:
    """CPU cores: ``"500m"`` -> 0.5, ``"2"`` -> 2.0."""
    cores = parse_quantity(value, "cpu")
    if cores < 0:
        raise InvalidQuantityError(f"cpu {value!r} is negative")
    return float(cores)


def cpu_whole_cores(value: Quantity) -> int:
    """CPU as torchx's integer ``Resource.cpu``, rounded up (never less than asked), at least 1."""
    return max(1, math.ceil(cpu_cores(value)))


def memory_mib(value: Quantity) -> int:
    """Memory in MiB (torchx's ``memMB``), rounded down so it never exceeds a limit: ``"8G"``
    -> 7629, ``"8Gi"`` -> 8192; a plain number is bytes."""
    size = parse_quantity(value, "memory")
    if size < 0:
        raise InvalidQuantityError(f"memory {value!r} is negative")
    return int(size / MIB)
