"""What the engine's stored JSON documents share: field checks and canonical files.

The lineage, optimization and skill card documents check their fields with these functions, so a
malformed document is refused with the same wording wherever it is read: a `DocumentError` naming
the field (`states[2].source: must be a non-empty string, not ''`). `Document` gives a document
with `to_dict`/`from_dict` its canonical text (`fingerprint.document_text`: equal documents, equal
bytes) and its file.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from klineage.errors import DocumentError, KLineageError
from klineage.fingerprint import document_text, parse_document

E = TypeVar("E", bound=Enum)
D = TypeVar("D", bound="Document")


def has(data: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    """An object holding every key of `keys`; other keys pass (lineage parts read only what they know)."""
    if not isinstance(data, dict):
        raise DocumentError(where, f"must be an object, not {type(data).__name__}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise DocumentError(where, f"missing {', '.join(repr(k) for k in missing)}")
    return data


def need(data: Any, keys: tuple[str, ...], where: str, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object holding every key of `keys` and none beyond them and `optional`."""
    data = has(data, keys, where)
    unknown = sorted(set(data) - set(keys) - set(optional))
    if unknown:
        raise DocumentError(where, f"unknown keys {unknown}")
    return data


def enum(kind: type[E], value: Any, where: str) -> E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise DocumentError(where, f"unknown value {value!r} (one of: {allowed})") from None


def choice(kind: type[E], value: Any, what: str) -> E:
    """A caller's argument given as a member or its value; a wrong one is a usage error, not a
    malformed document, so it raises KLineageError naming `what` it is ("unknown strategy ...")."""
    try:
        return value if isinstance(value, kind) else kind(value)
    except ValueError:
        raise KLineageError(f"unknown {what} {value!r} (one of: {', '.join(str(m.value) for m in kind)})") from None


def text(value: Any, where: str, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise DocumentError(where, f"must be {'a' if empty else 'a non-empty'} string, not {value!r}")
    return value


def nonblank(value: Any, where: str) -> str:
    """A string with more than whitespace in it (card fields a reader must be able to act on)."""
    if not isinstance(value, str) or not value.strip():
        raise DocumentError(where, f"must be a non-empty string, not {value!r}")
    return value


def whole(value: Any, where: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise DocumentError(where, f"must be a whole number >= {minimum}, not {value!r}")
    return value


def number(value: Any, where: str, positive: bool = False) -> float:
    """A finite number (a bool is not one), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DocumentError(where, f"must be a finite number, not {value!r}")
    if positive and value <= 0:
        raise DocumentError(where, f"must be > 0, not {value!r}")
    return float(value)


def nonnegative(value: Any, where: str) -> float:
    """A number >= 0 (a bool is not one), such as the gate seconds a document adds up."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise DocumentError(where, f"must be a number >= 0, not {value!r}")
    return value


def listed(value: Any, where: str) -> list[Any]:
    """A list; a tuple too, since frozen documents hold their lists as tuples."""
    if not isinstance(value, (list, tuple)):
        raise DocumentError(where, f"must be a list, not {type(value).__name__}")
    return list(value)


def save_document(data: Any, path: str | Path) -> Path:
    """Write the canonical text of `data` to `path`, making its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(document_text(data).encode("utf-8"))
    return path


class Document:
    """A document read and written whole: the subclass gives `to_dict`, `from_dict(data)` (which
    names its own fields in errors) and `document_name`, what errors call it."""

    document_name: ClassVar[str]

    def to_json(self) -> str:
        """The canonical text: sorted keys, one-space indent, a final newline. Equal documents give equal bytes."""
        return document_text(self.to_dict())

    @classmethod
    def from_json(cls: type[D], text: str, where: str | None = None) -> D:
        """`where` names the text in a JSON syntax error (default: the document's name)."""
        return cls.from_dict(parse_document(text, cls.document_name if where is None else where))

    def save(self, path: str | Path) -> Path:
        return save_document(self.to_dict(), path)

    @classmethod
    def load(cls: type[D], path: str | Path) -> D:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DocumentError(str(path), f"no such {cls.document_name} file") from None
        return cls.from_json(text, str(path))
