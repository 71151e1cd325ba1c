"""String helpers (upstream's ``torchx.util.strings``)."""

from __future__ import annotations

import re


def normalize_str(data: str) -> str:
    """Lower-cased, with every character outside ``[a-z0-9-]`` dropped (and one leading
    ``-``): a name Kubernetes-like schedulers accept."""
    if data.startswith("-"):
        data = data[1:]
    return "".join(re.findall(r"[a-z0-9\-]", data.lower()))
