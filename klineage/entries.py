"""How a plan's launch names its kernel: a plain name, a template instance (`gemm<128, 64>`), a full signature
(`void gemm<128, 64>(float*)`) or an Itanium-mangled symbol. The static checks read the function's name from it, the
compiler stage matches it against the cubin's demangled names, and `klineage.specialize` reads the template
arguments of the instance it writes out.
"""

from __future__ import annotations

import re


def normalized(name: str) -> str:
    """`name` with blanks only where they separate two identifier characters (`unsigned int`): two spellings of one
    name or argument list compare equal."""
    return re.sub(r"\s*([^\w\s])\s*", r"\1", " ".join(name.split()))


def strip_bracketed(text: str, opening: str, closing: str) -> str:
    """`text` without a trailing balanced `(...)` or `<...>` group."""
    if not text.endswith(closing):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {closing: 1, opening: -1}.get(text[i], 0)
        if depth == 0:
            return text[:i].rstrip()
    return text


def entry_name(entry: str) -> tuple[str, bool | None] | None:
    """(function name, whether template arguments are given) of a plan entry written as a name,
    `gemm<128, 64>`, a signature or an Itanium-mangled symbol; None when it cannot be read."""
    entry = entry.strip()
    if entry.startswith("_Z"):
        return _mangled_name(entry)
    entry = strip_bracketed(entry, "(", ")")
    stripped = strip_bracketed(entry, "<", ">")
    base = stripped.split()[-1].split("::")[-1] if stripped.split() else ""
    return (base, stripped != entry) if base.isidentifier() else None


def template_arguments(entry: str) -> list[str] | None:
    """The template arguments an entry gives (`k<float, 256>`, or a signature of that instance), split at their
    top-level commas; [] for `k<>` (every one a default); None where it gives none or is mangled."""
    text = strip_bracketed(entry.strip(), "(", ")")
    if text.startswith("_Z") or not text.endswith(">"):
        return None
    inner = text[len(strip_bracketed(text, "<", ">")):].strip()[1:-1]
    if not inner.strip():
        return []
    depth, parts, current = 0, [], ""
    for char in inner:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts if all(parts) else None


def _mangled_name(symbol: str) -> tuple[str, None] | None:
    """The function's own name in `_Z4gemmILi128EEvPf` or `_ZN2ns6kernelEv` (the last component)."""
    nested = symbol.startswith("_ZN")
    position, name = (3 if nested else 2), None
    while match := re.match(r"\d+", symbol[position:]):
        length = int(match.group())
        start = position + len(match.group())
        name, position = symbol[start:start + length], start + length
        if not nested:
            break
    return (name, None) if name and name.isidentifier() else None


__all__ = ["entry_name", "normalized", "strip_bracketed", "template_arguments"]
