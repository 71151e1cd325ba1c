"""Shared by the reference stages: fsspec I/O of the splits and the model definition."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import time
import traceback
from typing import Any, Callable, Dict, Tuple

import fsspec
import numpy as np

SPLITS = ("train", "val", "test")


def record_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Write an uncaught exception to $TORCHELASTIC_ERROR_FILE (torchelastic's reply-file
    format), so ``torchx status`` shows the exception, not only an exit code."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            return main(*args, **kwargs)
        except Exception as e:
            path = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if path and not os.path.exists(path):
                info = {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}
                with open(path, "w") as f:
                    json.dump(
                        {"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": info}}, f
                    )
            raise

    return wrapper


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def write_bytes(url: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(data)


def read_bytes(url: str) -> bytes:
    with fsspec.open(url, "rb") as f:
        return f.read()


def write_json(url: str, data: Dict[str, Any]) -> None:
    write_bytes(url, json.dumps(data, indent=2, sort_keys=True).encode())


def read_json(url: str) -> Dict[str, Any]:
    return json.loads(read_bytes(url))


def exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(path)


def save_split(base: str, split: str, x: np.ndarray, y: np.ndarray) -> str:
    buf = io.BytesIO()
    np.savez(buf, x=x.astype(np.float32), y=y.astype(np.int64))
    write_bytes(join(base, f"{split}.npz"), buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def load_split(base: str, split: str) -> Tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(read_bytes(join(base, f"{split}.npz")))) as data:
        return data["x"], data["y"]


def make_model(in_features: int = 64, hidden: int = 128, classes: int = 10) -> Any:
    import torch.nn as nn

    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )
