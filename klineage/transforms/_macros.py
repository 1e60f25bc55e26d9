"""Function-like macros expanded where the code calls them, as the preprocessor expands them, so that the analysis
forwards read an index written through a macro (`x[IDX(r, j, cols)]` with `#define IDX(r, c, C) ((r) * (C) + (c))`)
as the subscript the compiler sees.

The expansion is the preprocessor's own: each parameter of the body replaced by its argument's text, the body put
in place of the call, neither wrapped in parentheses the author did not write (a macro that leaves an argument bare
means what the preprocessor makes of it); a blank goes between two pieces only where they would otherwise run
together into one token (`a-` and `-b`). A call inside an argument or inside a body is expanded on a later pass,
which is the preprocessor's rescan.

A macro is expanded only where that is certain to be the preprocessor's result: it is defined once, never
`#undef`ined, has named parameters only (no `...`), and its body has no `#` or `##` operator, no string or
character literal and does not name itself; a call passes as many arguments as it has parameters. A call that is
no such macro's is left as written, and the `#define` lines stay (unused once every call is expanded).

An object-like macro is expanded the same way where its body names a thread coordinate (`#define IDX (blockIdx.x *
blockDim.x + threadIdx.x)`, `int i = IDX;`): the index the forwards read. Other object-like macros (constants, a
tile's side) stay as written, since nothing reads through them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import call_arguments, splice

_PASSES = 8  # nested macros deeper than this stay as written
_FUSING = re.compile(r"[\w.]{2}|[-+*/%<>=&|!^~]{2}")  # two characters that would read as one token
_COORDINATE = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\b")


def expanded(state: KernelState) -> KernelState:
    """`state` with every call of an expandable function-like macro, and every use of an object-like one naming a
    thread coordinate, expanded (the same state where there is none)."""
    for _ in range(_PASSES):
        parsed = cp.parse(state.source)
        macros = _expandable(parsed)
        edits = [] if not macros else [
            (call.start_byte, call.end_byte, text) for call, text in _calls(parsed, macros)]
        if not edits:
            return state
        state = KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)
    return state


def _expandable(parsed: cp.ParsedSource) -> dict[str, cp.Macro]:
    found = cp.macros(parsed)
    names = [macro.name for macro in found]
    undefined = set(re.findall(r"^\s*#\s*undef\s+(\w+)", parsed.data.decode("utf-8"), re.MULTILINE))
    return {macro.name: macro for macro in found
            if (macro.params is not None or _COORDINATE.search(macro.body)) and names.count(macro.name) == 1 and
            macro.name not in undefined and all(re.fullmatch(r"[A-Za-z_]\w*", p) for p in macro.params or ()) and
            not re.search(r"[#\"']", macro.body) and not re.search(rf"\b{macro.name}\b", macro.body)}


def _calls(parsed: cp.ParsedSource, macros: dict[str, cp.Macro]) -> list[tuple[Node, str]]:
    """(call, its expansion) of each outermost call of a macro in `macros` outside the preprocessor's lines, and of
    each loop header written as one (`CUDA_KERNEL_LOOP(i, n) { ... }` in a body, which the grammar reads as a nested
    function's declarator)."""
    found, data = [], parsed.data.decode("latin-1")  # one character a byte: the calls' offsets index it
    for call in cp.nodes_of_type(parsed.root, "call_expression"):
        macro = _macro_of(parsed, call, macros)
        if macro is None or macro.params is None or _in_directive(call) or \
                any(_macro_of(parsed, outer, macros) is not None for outer in _ancestors(call, "call_expression")):
            continue
        found += _expansion(data, call, macro, [parsed.text(a) for a in call_arguments(call)])
    for name in cp.nodes_of_type(parsed.root, "identifier"):  # an object-like macro's uses
        macro = macros.get(parsed.text(name))
        if macro is not None and macro.params is None and not _in_directive(name) and \
                cp.enclosing_function(name) is not None:
            found.append((name, _spaced(data, name.start_byte, name.end_byte, " ".join(macro.body.split()))))
    for header in _statement_headers(parsed, macros):
        parameters = header.child_by_field_name("parameters").named_children
        macro = macros[parsed.text(header.child_by_field_name("declarator"))]
        found += _expansion(data, header, macro, [parsed.text(p) for p in parameters])
    return found


def _expansion(data: str, call: Node, macro: cp.Macro, arguments: list[str]) -> list[tuple[Node, str]]:
    if macro.params is None or len(arguments) != len(macro.params):
        return []
    values = dict(zip(macro.params, arguments, strict=True))
    body = re.sub(r"[A-Za-z_]\w*", lambda name: name[0] if name[0] not in values else  # the body's own text stays
                  _spaced(name.string, name.start(), name.end(), values[name[0]]), macro.body)
    return [(call, _spaced(data, call.start_byte, call.end_byte, " ".join(body.split())))]


def _statement_headers(parsed: cp.ParsedSource, macros: dict[str, cp.Macro]) -> Iterator[Node]:
    """The declarators of "functions" defined inside a function's body with no type, named by a macro of `macros`
    and with plain names for arguments: a macro call heading a statement, since C++ defines no function there."""
    for definition in cp.nodes_of_type(parsed.root, "function_definition"):
        declarator = definition.child_by_field_name("declarator")
        if definition.child_by_field_name("type") is not None or cp.enclosing_function(definition) is None \
                or declarator is None or declarator.type != "function_declarator" or declarator.has_error:
            continue
        name, parameters = declarator.child_by_field_name("declarator"), declarator.child_by_field_name("parameters")
        if name.type == "identifier" and parsed.text(name) in macros and all(
                re.fullmatch(r"[A-Za-z_]\w*", parsed.text(p)) for p in parameters.named_children):
            yield declarator


def _macro_of(parsed: cp.ParsedSource, call: Node, macros: dict[str, cp.Macro]) -> cp.Macro | None:
    function = call.child_by_field_name("function")
    return macros.get(parsed.text(function)) if function is not None and function.type == "identifier" else None


def _ancestors(node: Node, kind: str) -> Iterator[Node]:
    node = node.parent
    while node is not None:
        if node.type == kind:
            yield node
        node = node.parent


def _in_directive(node: Node | None) -> bool:
    while node is not None:
        if node.type.startswith("preproc_") and node.type not in ("preproc_if", "preproc_ifdef", "preproc_else",
                                                                  "preproc_elif"):
            return True
        node = node.parent
    return False


def _spaced(text: str, start: int, end: int, value: str) -> str:
    """`value` standing for text[start:end], with a blank on a side where it would otherwise fuse with its
    neighbour into one token."""
    before = text[start - 1:start] if start > 0 else ""
    after = text[end:end + 1]
    return (" " if value and _FUSING.fullmatch(before + value[0]) else "") + value + \
        (" " if value and _FUSING.fullmatch(value[-1] + after) else "")
