"""`to_dict` / `from_dict` derived from the fields of a frozen dataclass, for the plain parts of stored documents.

A part whose dictionary is its fields in the order declared, each as JSON holds it (a string, number or bool as
it is, an enum as its value, a tuple as a list, a nested part as its own `to_dict`), needs no hand-written pair:

    @codec.part("ref")
    @dataclass(frozen=True)
    class Ref:
        lineage: str
        kind: RefKind
        index: int

The field list stays the schema a reader looks at. Reading refuses a missing or unknown key and a value of the
wrong type with a `DocumentError` naming the field (`cards[3].evidence[0].index: ...`); the part's own
`__post_init__` checks, which name the field after the part (`ref.index`), are reported under the name the
reader gave (`where`) too. A field made with `omitted(default)` is left out at its default and read as it when
absent: a key added after documents were stored, so that those documents keep their bytes.

Parts whose dictionary is anything else (renamed or derived keys, sorted sets, several optional shapes) keep
their hand-written pair: this is for the plain ones only.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from klineage.documents import enum, listed, need, number, text
from klineage.errors import DocumentError

T = TypeVar("T")
_OMITTED = "klineage.codec.omitted"


def omitted(default: Any) -> Any:
    """A field left out of the dictionary while it holds `default`, and `default` when its key is absent."""
    return dataclasses.field(default=default, metadata={_OMITTED: True})


def part(name: str) -> Callable[[type[T]], type[T]]:
    """Give a frozen dataclass the derived `to_dict` and `from_dict(data, where=name)`; `name` is what its own
    checks call it (`ref` for `ref.index`), and the `where` an error names when the reader gives none."""

    def derive(kind: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(kind) or not kind.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise TypeError(f"codec.part: {kind.__name__} is not a frozen dataclass")

        def from_dict_(cls: type[T], data: Any, where: str = name) -> T:
            return from_dict(cls, data, where, name)

        kind.to_dict = to_dict  # type: ignore[attr-defined]
        kind.from_dict = classmethod(from_dict_)  # type: ignore[attr-defined]
        return kind

    return derive


def to_dict(value: Any) -> dict[str, Any]:
    """The fields of a part, in the order declared, each as JSON holds it; an `omitted` field at its default
    left out."""
    return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)
            if not (f.metadata.get(_OMITTED) and getattr(value, f.name) == f.default)}


def from_dict(kind: type[T], data: Any, where: str, name: str) -> T:
    """The part `kind` read from `data`: every field's key present (an `omitted` one may be absent), no other
    key, each value of its field's type; errors name `where` and the field."""
    parts = dataclasses.fields(kind)  # type: ignore[arg-type]
    data = need(data, tuple(f.name for f in parts if not f.metadata.get(_OMITTED)), where,
                optional=tuple(f.name for f in parts if f.metadata.get(_OMITTED)))
    hints = _hints(kind)
    values = {f.name: _decode(hints[f.name], data[f.name], f"{where}.{f.name}") for f in parts if f.name in data}
    try:
        return kind(**values)
    except DocumentError as exc:  # the part's own check, named after the part: name it where the reader reads
        if exc.where == name or exc.where.startswith((f"{name}.", f"{name}[")):
            raise DocumentError(where + exc.where[len(name):], exc.message) from None
        raise


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _encode(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if dataclasses.is_dataclass(value):
        return value.to_dict()  # type: ignore[attr-defined]
    return value


def _decode(kind: Any, value: Any, where: str) -> Any:
    """`value` checked against the field type `kind`, as the part holds it. Numbers are kept as written (an int
    where a float is declared stays an int), so that a document read and written again keeps its bytes."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        return None if value is None else _decode(next(a for a in args if a is not type(None)), value, where)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(listed(value, where)))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return enum(kind, value, where)
    if dataclasses.is_dataclass(kind):
        return kind.from_dict(value, where)  # type: ignore[union-attr]
    if kind is bool:
        if not isinstance(value, bool):
            raise DocumentError(where, f"must be true or false, not {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DocumentError(where, f"must be a whole number, not {value!r}")
        return value
    if kind is float:
        number(value, where)
        return value
    if kind is str:
        return text(value, where)
    raise TypeError(f"codec: no rule for a field of type {kind!r} ({where})")
