"""Content fingerprints: sha256 over canonical JSON or normalized text."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any, *, allow_nan: bool = True) -> str:
    """allow_nan False: NaN and Infinity, which JSON cannot hold, raise ValueError."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(value: Any) -> str:
    return sha256_text(canonical_json(value))


def normalize_source(text: str) -> str:
    """Line endings and trailing blanks do not change what a kernel computes."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def document_text(value: Any) -> str:
    """The canonical text of a stored document: sorted keys, one-space indent, a final newline.
    Equal documents give equal bytes, so stored lineages and cards diff and replay exactly."""
    return json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def parse_document(text: str, where: str) -> Any:
    from klineage.errors import DocumentError

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(where, f"not JSON: {exc}") from None
