"""Integer locals that only name a place read as the arithmetic they hold, so that a forward that reads operands as
`A[<index>]` reads a kernel however its author named an offset.

People often name an element's offset, or a row's start, before they subscript with it:

    int a_off = b * M * K + r * K;                   size_t idx = (size_t)row * cols + col;
    for (int k = 0; k < K; ++k) acc += A[a_off + k] * ...    out[idx] = f(x[idx]);

`folded` writes each use of such a local as its value and drops the declaration, where `int o = E;` (any integer
type, const or not) declares a local once that nothing assigns, increments or takes the address of, whose every use
after it is inside a subscript's index or the offset of a local pointer's declaration (`p = A + o`), and E is
integer arithmetic (sums, products, casts) that reads no thread or block coordinate (an index local is what the
forwards read by its declaration), over names that nothing writes after the declaration nor declares again and over
elements of pointer parameters the kernel never writes (a gathered row, `idx[r] * cols`): E has one value wherever
the local is read. A 32-bit local folds only a value formed in 32 bits (no cast, every name 32-bit), so that no
narrowing is lost (`int o = (size_t)r * K;` keeps its truncation, as written). The value goes in bare where it is a
whole index or a term of a sum, in parentheses elsewhere, so each use names the element it did. Anything else is
left as written.

The forwards that read operands by their subscripts call it on their own reading (a matrix product's); it is not
part of `canonical`, whose output every forward writes: the readers with their own offset locals (a pair's two
elements, a transpose's temporaries) keep the names their kernels gave.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import (
    INTEGER_ARITHMETIC,
    declared_kind,
    edited_to_fixpoint,
    is_written,
    operator,
    outer_parens,
    params,
    through_blanks,
)
from klineage.transforms._naive import INTEGER_CAST

_INTEGER = re.compile(r"(?:const )?(?:(?:unsigned|signed) )?(?:int|long|long long|long int|size_t|ptrdiff_t|"
                      r"u?int(?:32|64)_t|unsigned)(?: const)?")
_COORDINATE = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\b")  # an index, which forwards read by name
_PLACE_PARENTS = ("binary_expression", "parenthesized_expression", "cast_expression")


def folded(state: KernelState) -> KernelState:
    """`state` with every such local (see the module's docstring) read as its value; the same state when there is
    none. A local declared from another (`o2 = o1 + c`) folds once the first has: each pass folds one level."""
    return edited_to_fixpoint(state, _edits, _MAX_LEVELS)


_MAX_LEVELS = 4


def _edits(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[tuple[int, int, str]]:
    readonly = _read_only_arrays(parsed, function, body)
    widths = _widths(parsed, function)
    edits: list[tuple[int, int, str]] = []
    taken: list[tuple[int, int]] = []  # spans already edited this pass: a fold inside another waits a pass
    for declaration in cp.nodes_of_type(body, "declaration"):
        declarators = declaration.children_by_field_name("declarator")
        if declaration.parent.type != "compound_statement" or len(declarators) != 1 or \
                declarators[0].type != "init_declarator" or \
                not _INTEGER.fullmatch(declared_kind(parsed, declaration)):
            continue
        name_node, value = declarators[0].child_by_field_name("declarator"), declarators[0].child_by_field_name("value")
        if name_node is None or name_node.type != "identifier" or value is None:
            continue
        local, text = parsed.text(name_node), " ".join(parsed.text(value).split())
        # the local's uses in its block (a loop body may declare it afresh each pass, another block its own)
        uses = [node for node in cp.nodes_of_type(declaration.parent, "identifier")
                if parsed.text(node) == local and node.start_byte > declaration.end_byte]
        if not uses or any(not _is_place(parsed, node) or _declares(node) for node in uses) or \
                not _fixed(parsed, function, body, declaration, text, readonly) or \
                (_width(declared_kind(parsed, declaration)) == _NARROW and not _narrow(text, widths)) or \
                any(start < declaration.end_byte and declaration.start_byte < end for start, end in taken):
            continue
        edits.append((declaration.start_byte, through_blanks(parsed, declaration), ""))
        edits += [(outer_parens(node).start_byte, outer_parens(node).end_byte,
                   text if _bare(outer_parens(node), text) else f"({text})") for node in uses]
        taken += [(declaration.start_byte, declaration.end_byte)] + \
            [(node.start_byte, node.end_byte) for node in uses]
    return edits


def _is_place(parsed: cp.ParsedSource, use: Node) -> bool:
    """`use` is read inside a subscript's index, or inside the offset of a pointer declared from another (`p = A +
    o`), through sums, products, casts and parentheses only: nothing reads the local as a number of its own."""
    node = use
    while node.parent is not None and node.parent.type in _PLACE_PARENTS:
        node = node.parent
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "subscript_argument_list" or (parent.type == "subscript_expression" and
                                                     parent.child_by_field_name("index") == node):
        return True
    declarator = parent.child_by_field_name("declarator") if parent.type == "init_declarator" else None
    return declarator is not None and declarator.type == "pointer_declarator" and \
        parent.child_by_field_name("value") == node


def _bare(place: Node, value: str) -> bool:
    """Whether `value` may stand unparenthesized at `place`: the whole index or offset, or a term of a sum (either
    side of `+`, the left of `-`), where a sum of its own means the same; a factor, a cast's operand or the right of
    `-` takes parentheses."""
    parent = place.parent
    if parent.type in ("subscript_argument_list", "subscript_expression"):
        return True
    symbol = operator(parent) if parent.type == "binary_expression" else ""
    return symbol == "+" or (symbol == "-" and parent.child_by_field_name("left") == place)


def _fixed(parsed: cp.ParsedSource, function: cp.Function, body: Node, declaration: Node, value: str,
           readonly: set[str]) -> bool:
    """Whether `value` has one value wherever the local is read: integer arithmetic over names nothing writes,
    declares again or takes the address of after the declaration, and elements of read-only pointer parameters."""
    names = "|".join(sorted(readonly))
    plain = re.sub(rf"\b(?:{names})\[[\w\s*+\-]*\]", "0", value) if names else value
    if not INTEGER_ARITHMETIC.fullmatch(plain) or _COORDINATE.search(value):
        return False
    read = set(re.findall(r"[A-Za-z_]\w*", value)) - readonly
    for node in cp.nodes_of_type(function.node, "identifier"):
        if parsed.text(node) not in read:
            continue
        parent = node.parent
        if parent.type == "reference_declarator" or \
                (parent.type == "pointer_expression" and parsed.text(parent).startswith("&")):
            return False  # bound to a reference or its address taken: anything could write it
        # written or declared again after the declaration, in its block (where every use stands)
        if declaration.end_byte < node.start_byte < declaration.parent.end_byte and \
                (is_written(node) or _declares(node)):
            return False
    return True


def _declares(node: Node) -> bool:
    """`node` is the name a declaration (of a local or a parameter) declares."""
    parent = node.parent
    if parent.type in ("init_declarator", "reference_declarator", "parameter_declaration", "pointer_declarator"):
        return parent.child_by_field_name("declarator") == node
    return parent.type == "declaration" and node in parent.children_by_field_name("declarator")


def counts_inlined(state: KernelState) -> KernelState:
    """`state` with each count a kernel names by a local (`int total = M * N;`, then `if (idx < total)`, `for (...;
    i < total; ...)`) read as its arithmetic wherever it is named: a local of an integer type declared once at the
    top of the kernel's body, from integer arithmetic over scalar parameters nothing writes (no thread coordinate,
    no array), that nothing writes, addresses or declares again, whose value fits its type (a 32-bit local holds a
    value formed in 32 bits). The value goes in bare where it is a subscript, a comparison's operand or a term of a
    sum, in parentheses elsewhere. The forwards then read the count as they read `M * N` written out, and the kernel
    computes what it did."""
    return edited_to_fixpoint(state, _count_edits, _MAX_LEVELS)


def _count_edits(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[tuple[int, int, str]]:
    scalars = {p.name for p in params(parsed, function.node) if not p.indirection}
    written = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier") if is_written(n) or
               (n.parent.type == "pointer_expression" and parsed.text(n.parent).startswith("&"))}
    widths = _widths(parsed, function)
    for declaration in (c for c in body.named_children if c.type == "declaration"):
        declarators = declaration.children_by_field_name("declarator")
        kind = declared_kind(parsed, declaration) if declarators else ""
        if len(declarators) != 1 or declarators[0].type != "init_declarator" or not _INTEGER.fullmatch(kind):
            continue
        name_node, value = declarators[0].child_by_field_name("declarator"), declarators[0].child_by_field_name("value")
        if name_node is None or name_node.type != "identifier" or value is None:
            continue
        local, text = parsed.text(name_node), " ".join(parsed.text(value).split())
        names = set(re.findall(r"[A-Za-z_]\w*", re.sub(INTEGER_CAST, "", text)))
        uses = [n for n in cp.nodes_of_type(body, "identifier")
                if parsed.text(n) == local and n.start_byte > declaration.end_byte]
        if not uses or local in written or names - scalars or names & written or \
                not INTEGER_ARITHMETIC.fullmatch(text) or any(_declares(n) for n in uses) or \
                (_width(kind) == _NARROW and not _narrow(text, widths)):
            continue
        return [(declaration.start_byte, through_blanks(parsed, declaration), "")] + \
            [(n.start_byte, n.end_byte, text if _bare_count(n) else f"({text})") for n in uses]
    return []  # one count a pass: a count declared from another folds on the next


def _bare_count(use: Node) -> bool:
    """Whether a count's value may stand unparenthesized at `use`: a subscript, a comparison's operand, a term of a
    sum (either side of `+`, the left of `-`)."""
    place = outer_parens(use)
    parent = place.parent
    if parent.type in ("subscript_argument_list", "subscript_expression"):
        return True
    symbol = operator(parent) if parent.type == "binary_expression" else ""
    return symbol in ("<", "<=", ">", ">=", "==", "!=", "+") or \
        (symbol == "-" and parent.child_by_field_name("left") == place)


_NARROW, _WIDE = "32-bit", "64-bit"


def _width(kind: str) -> str:
    """The width of an integer type's spelling (`const int`, `size_t`, `unsigned long long`), "" for another type."""
    if re.search(r"\b(?:long|size_t|ptrdiff_t|u?int64_t)\b", kind):
        return _WIDE
    return _NARROW if re.search(r"\b(?:int|unsigned|u?int32_t)\b", kind) else ""


def _widths(parsed: cp.ParsedSource, function: cp.Function) -> dict[str, set[str]]:
    """Each name the function declares (its parameters, pointed-to elements for pointers, and its locals) -> the
    widths of the integer types it is declared with ("" for any other type)."""
    found: dict[str, set[str]] = {}
    for param in params(parsed, function.node):
        found.setdefault(param.name, set()).add(_width(param.type))
    for declaration in cp.nodes_of_type(function.node, "declaration"):
        width = _width(declared_kind(parsed, declaration)) if declaration.children_by_field_name("declarator") else ""
        for declarator in declaration.children_by_field_name("declarator"):
            name = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
            if name is not None and name.type == "identifier":
                found.setdefault(parsed.text(name), set()).add(width)
    return found


def _narrow(value: str, widths: dict[str, set[str]]) -> bool:
    """Whether `value` is formed in 32 bits: no cast, no 64-bit literal, and every name (an element's array
    included) declared 32-bit only, so a 32-bit local holds the value itself and narrows nothing."""
    if re.search(r"\(\s*[A-Za-z_][\w\s]*\)\s*[\w(]|\b\d+[uU]?[lL]|\bsizeof\b", value):
        return False
    return all(widths.get(name) == {_NARROW} for name in re.findall(r"[A-Za-z_]\w*", value))


def _read_only_arrays(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> set[str]:
    """Pointer parameters the kernel never stores to (an index table read to find a row)."""
    stored = {parsed.text(node.child_by_field_name("argument")) for node in
              cp.nodes_of_type(body, "subscript_expression") if is_written(node)}
    return {param.name for param in params(parsed, function.node) if param.indirection == "*"} - stored
