"""Writing a file so that no reader ever sees half of it, from any process or thread."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` so that no reader sees half of it (`_replace_atomically`)."""
    return _replace_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8", newline=""))


def write_atomic_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` so that no reader sees half of it (`_replace_atomically`)."""
    return _replace_atomically(path, lambda temporary: temporary.write_bytes(data))


def _replace_atomically(path: str | Path, write: Callable[[Path], object]) -> Path:
    """`write` the file beside `path` under a name no other writer uses, then rename it into place.
    Writers of the same content may race; the last rename wins and every reader sees a whole file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path
