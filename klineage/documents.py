"""What the engine's stored JSON documents share: field checks and canonical files.

The lineage, optimization and skill card documents check their fields with these functions, so a
malformed document is refused with the same wording wherever it is read: a `DocumentError` naming
the field (`states[2].source: must be a non-empty string, not ''`). `Document` gives a document
with `to_dict`/`from_dict` its canonical text (`fingerprint.document_text`: equal documents, equal
bytes) and its file. A file whose name ends in `.gz` is stored gzip-compressed (the big walks kept
in bench/walks/ are about a fifth of their size so) and read back transparently.
"""

from __future__ import annotations

import gzip
import io
import math
import zlib
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
    """Write the canonical text of `data` to `path` (gzip-compressed when it ends in `.gz`), making
    its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = document_text(data).encode("utf-8")
    path.write_bytes(gzip_packed(raw) if path.suffix == ".gz" else raw)
    return path


def gzip_packed(raw: bytes) -> bytes:
    """`raw` gzip-compressed, the same bytes every time: no file name and mtime 0 in the header, so
    equal documents give equal files (a walk saved again shows no diff). GzipFile writes the same OS
    byte on every Python; gzip.compress does not."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as packed:
        packed.write(raw)
    return buffer.getvalue()


def read_document_text(path: str | Path, what: str = "document") -> str:
    """The text of a document file, decompressed when its name ends in `.gz`. A missing, corrupt or
    non-UTF-8 file raises DocumentError naming it (`what` says what kind of file was missing)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DocumentError(str(path), f"no such {what} file") from None
    return unpacked_text(raw, path)


def unpacked_text(raw: bytes, path: Path) -> str:
    """The text of the bytes read from `path`, decompressed when its name ends in `.gz`. Corrupt or
    non-UTF-8 bytes raise DocumentError naming `path`."""
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:  # bad header, cut short, bad data
            raise DocumentError(str(path), f"not a readable gzip file ({str(exc) or type(exc).__name__})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(str(path), f"not UTF-8 text (byte {exc.start})") from None


def document_files(folder: str | Path, pattern: str = "*.json") -> list[Path]:
    """The files of `folder` matching `pattern`, plain or gzip-compressed (`pattern` + `.gz`), by
    name. A document there in both forms is refused: it would be read twice, maybe differing."""
    folder = Path(folder)
    found = sorted([*folder.glob(pattern), *folder.glob(pattern + ".gz")])
    names = {p.name for p in found}
    both = [p.name for p in found if p.name + ".gz" in names]
    if both:
        raise DocumentError(str(folder), f"{', '.join(both)} stored both plain and as .gz: keep one")
    return found


def document_stem(path: str | Path, suffix: str) -> str:
    """The file name without `suffix` and a `.gz` after it: `fmha_flash_mma.gpu.json.gz`, `.gpu.json`
    -> `fmha_flash_mma`."""
    return Path(path).name.removesuffix(".gz").removesuffix(suffix)


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
        return cls.from_json(read_document_text(path, cls.document_name), str(path))
