"""A running sum, product or extreme whose first element is handled before its loop, read as the loop over the
whole row, the form the warp scans read (`_warp_reduction.py`).

People start a scan where its first output is, and loop over the rest:

    float acc = x[r * n];                        y[r * n] = x[r * n];
    y[r * n] = acc;                              for (int j = 1; j < n; ++j)
    for (int j = 1; j < n; ++j) {                    y[r * n + j] = y[r * n + j - 1] + x[r * n + j];
        acc += x[r * n + j];
        y[r * n + j] = acc;
    }

(the second reads the running value back from the element stored before). Both are read as

    float acc = -0.0f;
    for (int j = 0; j < n; ++j) {
        acc += x[r * n + j];
        y[r * n + j] = acc;
    }

(the second's running value in a local of the stored element's type, `running`). The start is the operation's
exact identity in the accumulator's type: -0.0 for a float sum (-0.0 + x is x for every x, a zero of either sign
included, where +0.0 would turn a -0.0 into +0.0), 1 for a product, a quiet NaN for fmaxf and its kin (which
return the other value), so the loop's first step computes the peeled value to the bit and every later step is
the same. A compound update converts as the read-back store does (`acc += v` rounds `acc + v` to the
accumulator's type, as storing `y[j - 1] + v` to the element's does), and the element read back is the one just
stored, so the values are the same.

Read only where it is certain: the loop runs a unit step from 1 over an int index; its body is a scan's two
statements (the update, then the store of the accumulator) or the one read-back store (`y[j] = y[j - 1] op v`,
`v op y[j - 1]`, `f(y[j - 1], v)`), whose value names no element of the stored array; the statements just before
it are the peeled start and store (in either order where the store writes the start's own expression again), and
the peeled value and place are the loop's at index 0: the same expression, each subscript the same polynomial
(`x[r * n]` is `x[r * n + j]` at j = 0; `_polynomials.py`), any other use of the index the literal 0. Anything else
is left as written.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._arg_reduction import element_types
from klineage.transforms._edit import (
    Edit,
    call_arguments,
    declared_kind,
    edited,
    indentation,
    local_types,
    own_lines,
    unparen,
)
from klineage.transforms._naive import squash, statements
from klineage.transforms._polynomials import Poly, constant, plus, polynomial, variable
from klineage.transforms._scan_spellings import NAN, SCAN_CALLS, read_scan, scan_update

_FROM_ONE = re.compile(r"^for\s*\(\s*int\s+(\w+)\s*=\s*1\s*;\s*\1\s*<\s*[^;]+;\s*(?:\+\+\1|\1\+\+|\1\s*\+=\s*1)\s*\)$")
_EXACT = {"+": {"float": "-0.0f", "double": "-0.0", "int": "0", "long long": "0"},
          "*": {"float": "1.0f", "double": "1.0", "int": "1", "long long": "1"}}
RUNNING = "running"  # the read-back scan's accumulator (renamed apart where the kernel names it)


def unpeeled(state: KernelState, only: str | None = None) -> KernelState:
    """`state` with each scan of its kernels (or of the kernel `only`) whose first element is peeled before its loop
    read as the loop from 0 (see the module's docstring); the same state where none is."""
    def edits(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[Edit]:
        taken = {parsed.text(node) for node in cp.nodes_of_type(function.node, "identifier")}
        types, elements = local_types(parsed, body), element_types(parsed, function)
        return [edit for block in cp.nodes_of_type(body, "compound_statement")  # the body among them
                for edit in _block_edits(parsed, block, types, elements, taken)]

    return edited(state, edits, only)


def _exact_start(op: str, kind: str | None) -> str | None:
    """The identity of `op` in the type `kind` that leaves every value's bits as they are; None where none is known."""
    if op in SCAN_CALLS:
        return NAN.get(kind or "")
    return _EXACT.get(op, {}).get(kind or "")


def _block_edits(parsed: cp.ParsedSource, block: Node, types: dict[str, str], elements: dict[str, str],
                 taken: set[str]) -> list[Edit]:
    listed = statements(block)
    found = []
    for k, loop in enumerate(listed):
        body = loop.child_by_field_name("body") if loop.type == "for_statement" else None
        header = _FROM_ONE.match(squash(parsed.data[loop.start_byte:body.start_byte].decode())) if body else None
        if header is None:
            continue
        edits = _peeled(parsed, listed[:k], body, header[1], types) or \
            _read_back(parsed, listed[:k], body, header[1], elements, taken)
        if edits:
            first = loop.child_by_field_name("initializer").children_by_field_name("declarator")[0]
            start = first.child_by_field_name("value")
            found += [*edits, Edit(start.start_byte, start.end_byte, "0")]
    return found


def _peeled(parsed: cp.ParsedSource, before: list[Node], body: Node, index: str,
            types: dict[str, str]) -> list[Edit] | None:
    """The edits that drop a peeled first step of the scan `body` holds (`acc += v; y[...] = acc;`): its start
    becomes the identity, its store goes; None where the two statements before the loop are no such step."""
    scan = read_scan(parsed, body)
    if scan is None or scan.exclusive or len(before) < 2:
        return None
    update, store = (s.named_children[0] for s in statements(body))
    right = unparen(update.child_by_field_name("right"))
    value = right if scan.op not in SCAN_CALLS else \
        next(a for a in call_arguments(right) if parsed.text(unparen(a)) != scan.accumulator)
    for start_at, store_at in ((-2, -1), (-1, -2)):
        start = _start(parsed, before[start_at], scan.accumulator)
        first = _plain_store(parsed, before[store_at])
        if start is None or first is None:
            continue
        # the store writes the start's value: the accumulator once it is set, or the start's expression again
        # (compared with no index: the start is before the loop)
        if not ((store_at == -1 and parsed.text(first[1]) == scan.accumulator) or
                _same_at(parsed, first[1], start, "", constant(0))):
            continue
        identity = _exact_start(scan.op, types.get(scan.accumulator))
        if identity is None or re.search(rf"\b{scan.accumulator}\b", parsed.text(start)) or \
                not _same_at(parsed, start, value, index, constant(0)) or \
                not _same_at(parsed, first[0], store.child_by_field_name("left"), index, constant(0)):
            return None
        gone = own_lines(parsed, before[store_at])
        if gone is None:
            return None
        return [Edit(start.start_byte, start.end_byte, identity), Edit(*gone, "")]
    return None


def _read_back(parsed: cp.ParsedSource, before: list[Node], body: Node, index: str, elements: dict[str, str],
               taken: set[str]) -> list[Edit] | None:
    """The edits that read `y[j] = y[j - 1] op v` after a peeled `y[0] = v(0)` as a scan of a local from the
    identity; None where the loop and the statement before it are not that."""
    listed = statements(body)
    store = _plain_store(parsed, listed[0]) if len(listed) == 1 else None
    first = _plain_store(parsed, before[-1]) if before else None
    if store is None or first is None:
        return None
    target, combined = store
    array = parsed.text(target.child_by_field_name("argument"))
    if combined.type == "binary_expression" and parsed.text(combined.child_by_field_name("operator")) in _EXACT:
        op, sides = parsed.text(combined.child_by_field_name("operator")), \
            [combined.child_by_field_name(side) for side in ("left", "right")]
    elif combined.type == "call_expression" and cp.call_name(combined) in SCAN_CALLS and \
            len(call_arguments(combined)) == 2:
        op, sides = cp.call_name(combined), call_arguments(combined)
    else:
        return None
    earlier = plus(variable(index), constant(-1))
    kept = [side for side in sides if _same_at(parsed, side, target, index, earlier)]
    if len(kept) != 1:
        return None
    value = sides[1 - sides.index(kept[0])]
    identity = _exact_start(op, elements.get(array))
    if identity is None or re.search(rf"\b{re.escape(array)}\b", parsed.text(value)) or \
            not _same_at(parsed, first[0], target, index, constant(0)) or \
            not _same_at(parsed, first[1], value, index, constant(0)):
        return None
    name = next(f"{RUNNING}{n or ''}" for n in range(len(taken) + 1) if f"{RUNNING}{n or ''}" not in taken)
    taken.add(name)
    indent = indentation(parsed.data, before[-1].start_byte)
    lines = [scan_update(op, name, squash(parsed.text(value))), f"{squash(parsed.text(target))} = {name};"]
    return [Edit(before[-1].start_byte, before[-1].end_byte, f"{elements[array]} {name} = {identity};"),
            Edit(body.prev_sibling.end_byte, body.end_byte,  # from the header's `)`: a bare body's line too
                 " {" + "".join(f"\n{indent}    {line}" for line in lines) + f"\n{indent}}}")]


def _start(parsed: cp.ParsedSource, statement: Node, accumulator: str) -> Node | None:
    """The value `statement` starts `accumulator` from (`T acc = e;` alone, or `acc = e;`), else None."""
    if statement.type == "declaration":
        declarators = statement.children_by_field_name("declarator")
        if len(declarators) != 1 or declarators[0].type != "init_declarator" or \
                parsed.text(declarators[0].child_by_field_name("declarator")) != accumulator or \
                declared_kind(parsed, statement).startswith("const"):
            return None
        return declarators[0].child_by_field_name("value")
    assignment = _plain_store(parsed, statement, subscript=False)
    return assignment[1] if assignment and parsed.text(assignment[0]) == accumulator else None


def _plain_store(parsed: cp.ParsedSource, statement: Node, subscript: bool = True) -> tuple[Node, Node] | None:
    """(target, value, unparenthesized) of the statement `target = value;` (target an element where `subscript`,
    else a name), else None."""
    node = statement.named_children[0] if statement.type == "expression_statement" and \
        statement.named_child_count == 1 else None
    if node is None or node.type != "assignment_expression" or \
            parsed.text(node.child_by_field_name("operator")) != "=":
        return None
    left = node.child_by_field_name("left")
    if left.type != ("subscript_expression" if subscript else "identifier"):
        return None
    return left, unparen(node.child_by_field_name("right"))


def _subscript_index(node: Node) -> Node:
    at = node.child_by_field_name("indices")
    return at.named_children[0] if at.type == "subscript_argument_list" and at.named_child_count == 1 else at


def _same_at(parsed: cp.ParsedSource, fixed: Node, general: Node, index: str, at: Poly) -> bool:
    """Whether `fixed` computes what `general` does where `index` is `at`: the same expression, each subscript's
    place the same polynomial (or, where either is none, the same expression in turn), any other use of the index
    an expression of that polynomial."""
    fixed, general = unparen(fixed), unparen(general)
    if general.type == "identifier" and parsed.text(general) == index:
        return polynomial(parsed, fixed, _names(parsed, fixed)) == at
    if general.type == "subscript_expression" and fixed.type == "subscript_expression":
        if not _same_at(parsed, fixed.child_by_field_name("argument"), general.child_by_field_name("argument"),
                        index, at):
            return False
        places = [_subscript_index(node) for node in (fixed, general)]
        names = _names(parsed, *places)
        found = polynomial(parsed, places[0], names), polynomial(parsed, places[1], names | {index: at})
        if None not in found:
            return found[0] == found[1]
        return _same_at(parsed, places[0], places[1], index, at)
    if fixed.type != general.type or fixed.child_count != general.child_count:
        return False
    if general.child_count == 0:
        return parsed.text(fixed) == parsed.text(general)
    return all(_same_at(parsed, f, g, index, at) for f, g in zip(fixed.children, general.children, strict=True))


def _names(parsed: cp.ParsedSource, *nodes: Node) -> dict[str, Poly]:
    return {parsed.text(name): variable(parsed.text(name)) for node in nodes
            for name in cp.nodes_of_type(node, "identifier")}
