"""The nvcc flags a launch plan may pass: an allow-list of whole flags, each one spelling only.

A flag can change what the compiler sees without a byte of the source changing: `-D` can define
`__device__` or a `%globaltimer` string, `-include` and `-I` bring in other files, `-Xcompiler` and
`-ccbin` hand options to (or replace) the host compiler, `-rdc` links external device code. So a
plan may only choose optimisation and code-generation settings, and define a macro in one safe
form: an upper-case name (no leading underscore, so no reserved or compiler name) set to an
integer, which cannot carry a keyword, a string or an attribute into the source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_BOOL = "(?:true|false)"
_PTXAS = r"(?:-O[0-3]|-v|--warn-on-spills|--warn-on-local-memory-usage)"
ALLOWED_FLAGS: tuple[tuple[str, str], ...] = (
    # (pattern, what it is, for the docs and the refusal message)
    (r"-O[0-3]", "host and device optimisation level"),
    (rf"--?(?:ftz|prec-div|prec-sqrt|fmad)={_BOOL}", "floating-point code generation"),
    (r"--?use_fast_math", "fast math"),
    (r"--?extra-device-vectorization", "vectorisation"),
    (r"--?restrict", "assume kernel pointers do not alias"),
    (r"-lineinfo|--generate-line-info", "line table (the gate always adds it)"),
    (r"--?maxrregcount=\d{1,3}", "register cap"),
    (r"-std=c\+\+(?:17|20)", "C++ dialect"),
    (r"--?expt-relaxed-constexpr|--?extended-lambda", "language extensions"),
    (rf"-Xptxas={_PTXAS}", "ptxas optimisation level or report"),
    (r"--?diag-suppress=\d{1,5}", "silence one warning number"),
    (r"-D[A-Z][A-Z0-9_]{0,63}(?:=-?\d{1,19})?", "an upper-case macro set to an integer"),
)
_ALLOWED = re.compile("|".join(f"(?:{pattern})" for pattern, _ in ALLOWED_FLAGS))


def refused_flags(flags: Iterable[str]) -> tuple[str, ...]:
    """The flags of `flags` that are not in the allow-list, in order."""
    return tuple(flag for flag in flags if not _ALLOWED.fullmatch(flag))


def refusal(flag: str) -> str:
    """Why `flag` is refused, in words a plan's author can act on."""
    if flag.startswith(("-D", "--define-macro")):
        why = "defines a macro the source does not show (only -DNAME=INTEGER with an upper-case NAME is allowed)"
    elif flag.startswith(("-U", "--undefine-macro")):
        why = "removes a macro the source relies on"
    elif flag.startswith(("-I", "-isystem", "--include-path", "-include", "--pre-include", "-optf", "--options-file")):
        why = "reads files other than the kernel's own source"
    elif flag.startswith(("-X", "--compiler-options", "--linker-options", "-ccbin", "--compiler-bindir")):
        why = "passes options to another tool (only -Xptxas=-O<n>, -Xptxas=-v and the warn-on options are allowed)"
    else:
        why = "is not an optimisation or code-generation choice the gate allows"
    return f"nvcc flag '{flag}' {why}; the allowed flags are listed in docs/kernel-policy.md"
