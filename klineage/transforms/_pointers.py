"""Local pointers into a parameter read as subscripts of the parameter itself, so that a forward that reads
operands as `A[<index>]` reads a kernel however its author named a row or a batch's start.

People often name the start of what a thread reads:

    const float* a_row = A + r * K;                  const float* Ab = A + b * M * K;
    for (int k = 0; k < K; ++k) acc += a_row[k] * ...    ... Ab[r * K + k] ...

A pointer walked by a loop (`_pointer_walks`) reads as subscripts once `canonical` has read it at the loop's index.

`inlined` rewrites each use `p[X]` of such a pointer as `A[E + X]` and drops its declaration, where `p = A + E;`
declares a pointer (const or not, `__restrict__` or not) that the kernel never assigns nor uses but through
subscripts, A is a pointer parameter the kernel never assigns, and E is integer arithmetic over names the
declaration can see that nothing assigns after it, and over elements of pointer parameters the kernel never writes
(a gathered row, `table + idx[r] * cols`): E has one value wherever p is read. `p[X]` and `A[E + X]` name one
element, so the kernel computes what it did. Anything else is left as written.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import INTEGER_ARITHMETIC, edited_to_fixpoint, is_written, through_blanks, written_names
from klineage.transforms._naive import parameters, squash

_DECLARATION = re.compile(r"(?:const )?[A-Za-z_][\w ]*\* (?:const )?(?:__restrict__ )?([A-Za-z_]\w*) = "
                          r"([A-Za-z_]\w*) \+ (.+);")


def inlined(state: KernelState) -> KernelState:
    """`state` with every such local pointer (see the module's docstring) read through its parameter; the same state
    when there is none. A pointer declared from another (`a_row = Ab + r * K`, `Ab = A + b * M * K`) is read
    through the parameter once the first is: each pass folds one level (a use inside another's subscript stays)."""
    return edited_to_fixpoint(state, _edits, _MAX_LEVELS)


_MAX_LEVELS = 4  # pointers declared from pointers, folded one level a pass


def _edits(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[tuple[int, int, str]]:
    pointers = {name for name, _, pointer in parameters(parsed, function) if pointer}
    written = written_names(parsed, body)
    edits = []
    for declaration in cp.nodes_of_type(body, "declaration"):
        found = _DECLARATION.fullmatch(squash(parsed.text(declaration)))
        if found is None or declaration.parent.type != "compound_statement":
            continue
        local, base, offset = found.groups()
        declared = [node for node in cp.nodes_of_type(function.node, "identifier") if parsed.text(node) == local
                    and node.parent.type in ("init_declarator", "pointer_declarator", "parameter_declaration",
                                             "declaration")]
        stored = {parsed.text(node.child_by_field_name("argument")) for node in
                  cp.nodes_of_type(body, "subscript_expression") if is_written(node)}
        if base not in pointers or base in written or local in written or len(declared) != 1 or \
                not _fixed_offset(parsed, body, declaration, offset, pointers - written - stored):
            continue  # assigned, declared again in an inner scope, or an offset that could change
        uses = [node for node in cp.nodes_of_type(declaration.parent, "identifier")
                if parsed.text(node) == local and node.start_byte > declaration.end_byte]
        subscripts = [node.parent for node in uses if node.parent.type == "subscript_expression"
                      and node.parent.child_by_field_name("argument") == node]
        bases = [node for node in uses if _declares_from(parsed, node)]  # `q = p + E2`: q is read through A too
        if not uses or len(subscripts) + len(bases) != len(uses):
            continue  # used as a pointer somewhere (`*p`, `p + 1`, an argument): kept
        edits.append((declaration.start_byte, through_blanks(parsed, declaration), ""))
        edits += [(node.start_byte, node.end_byte, f"{base} + {offset}") for node in bases]
        for subscript in subscripts:
            index = parsed.text(subscript.child_by_field_name("indices"))[1:-1].strip()
            index = index if INTEGER_ARITHMETIC.fullmatch(index) and "(" not in index else f"({index})"
            edits.append((subscript.start_byte, subscript.end_byte, f"{base}[{offset} + {index}]"))
    return edits


def _fixed_offset(parsed: cp.ParsedSource, body: Node, declaration: Node, offset: str, readonly: set[str]) -> bool:
    """Whether E of `p = A + E` has the same value wherever p is read: integer arithmetic over names that nothing
    assigns after the declaration, and elements of pointer parameters the kernel never writes at such indexes (a
    gathered row's start, `table + idx[r] * cols`)."""
    names = "|".join(sorted(readonly))
    plain = re.sub(rf"\b(?:{names})\[[\w\s*+\-]*\]", "0", offset) if names else offset
    if not INTEGER_ARITHMETIC.fullmatch(plain):
        return False
    read = set(re.findall(r"[A-Za-z_]\w*", offset)) - readonly
    return not any(parsed.text(node) in read and node.start_byte > declaration.start_byte and is_written(node)
                   for node in cp.nodes_of_type(body, "identifier"))


def aliases(parsed: cp.ParsedSource, body: Node) -> dict[str, str]:
    """The local pointers the body declares into another pointer (`float* out = y + row * cols;`): local -> the
    pointer it starts from, as written (a pointer declared from a local pointer maps to that local)."""
    found = (_DECLARATION.fullmatch(squash(parsed.text(d))) for d in cp.nodes_of_type(body, "declaration"))
    return {local: base for local, base, _ in (f.groups() for f in found if f is not None)}


def _declares_from(parsed: cp.ParsedSource, use: Node) -> bool:
    """`use` is the base of another local pointer's declaration `q = <use> + E`."""
    expression = use.parent
    if expression.type != "binary_expression" or expression.child_by_field_name("left") != use:
        return False
    declarator = expression.parent
    return declarator.type == "init_declarator" and declarator.child_by_field_name("value") == expression and \
        _DECLARATION.fullmatch(squash(parsed.text(declarator.parent))) is not None
