"""A sum that starts from a value other than zero read as a sum from zero with the start added after its loop, for
the forwards that share a row's sum among lanes and the matrix products' tiled forms.

People start a sum where its result begins: a matrix-vector product with a bias, a loss with its regularizer,

    float acc = bias[row];
    for (int j = 0; j < cols; ++j) acc += w[row * cols + j] * x[j];

Lanes that each take a share of the row must each start from zero (the start would be counted once a lane), so
`started_at_zero` writes the start into a local of its own where the sum was declared, the sum from zero, and the
start added once the loop is done:

    const float acc_start = bias[row];
    float acc = 0.0f;
    for (int j = 0; j < cols; ++j) acc += w[row * cols + j] * x[j];
    acc = acc_start + acc;

The start is evaluated where it was, so it is the same value. A matrix product's forms cannot evaluate it there:
their threads past the matrix's edge run the loop too (they load tiles), and would read `bias[c]` out of bounds.
For them `started_at_zero(..., late=True)` evaluates the start after the loop, under the guard the epilogue has:

    float acc = 0.0f;
    for (int j = 0; j < cols; ++j) acc += w[row * cols + j] * x[j];
    acc += bias[row];

(the sum `bias[row] + acc`: floating-point addition commutes). That is the same value only where the loop changes
nothing the start reads: the start calls no function with an effect and assigns nothing, the loop calls none
either, writes no array element or pointee (only locals) and assigns no name the start reads. Where that does not
hold the sum is left as written.

Either way the sum is added in another order: the start last, where the serial loop added it first.
Floating-point addition rounds differently in another order, as it does for every lane's partial sum in these
forwards (and for the tiled products' bias), whose outputs the gate judges against the problem's tolerance; this
reading is theirs alone (never `canonical`'s, whose rewrites keep every bit).

Read where the declaration (`T acc = E;`, one local of float, double or an integer type, E not zero) is followed
at once by a `for` loop in which every mention of the local is an update `acc += e` or `acc = acc + e` (e not
naming it), and nothing takes its address. Anything else is left as written.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._calls import first_effect
from klineage.transforms._edit import declared_kind, edited, indentation, written_names

_ZEROS = {"float": "0.0f", "double": "0.0", "int": "0", "long long": "0", "unsigned": "0u", "unsigned int": "0u"}
# a literal converted to an accumulator's type (`float(0)`, `static_cast<double>(1)`: a template's instance)
CONVERTED = r"(?:(?:{type})\(\s*(?:{value})\s*\)|static_cast<\s*(?:{type})\s*>\(\s*(?:{value})\s*\))"
_ZERO_TEXT = r"0+(?:\.0*)?(?:[eE][+-]?\d+)?[fFuUlL]*|0?\.0+(?:[eE][+-]?\d+)?[fF]?"
# a zero start as people write it: a literal, parenthesized or converted (the warp reductions' test of a sum's start)
ZERO = re.compile(rf"^\(?(?:{_ZERO_TEXT}|{CONVERTED.format(type='|'.join(_ZEROS), value=_ZERO_TEXT)})\)?$")
_UPDATE = r"{acc} \+= (?P<e>.+);|{acc} = {acc} \+ (?P<f>.+);"


def started_at_zero(state: KernelState, only: str | None = None, late: bool = False) -> KernelState:
    """`state` with each sum of its kernels (or of the kernel `only`) that starts elsewhere than zero read as the
    sum from zero and its start added after the loop (see the module's docstring; `late`: the start evaluated
    there too, where that reads the same value); the same state where none does."""
    def starts(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[tuple[int, int, str]]:
        taken = {parsed.text(node) for node in cp.nodes_of_type(function.node, "identifier")}
        return [found for block in cp.nodes_of_type(body, "compound_statement")  # the body among them
                for found in _starts(parsed, block, taken, late)]

    return edited(state, starts, only)


def _starts(parsed: cp.ParsedSource, block: Node, taken: set[str], late: bool) -> list[tuple[int, int, str]]:
    listed = [child for child in block.named_children if child.type != "comment"]
    edits = []
    for declaration, loop in zip(listed, listed[1:]):
        sum_ = _started_sum(parsed, declaration, loop)
        if sum_ is None:
            continue
        kind, acc, start = sum_
        indent = indentation(parsed.data, declaration.start_byte)
        if late:
            if _changes_start(parsed, declaration, loop):
                continue
            edits.append((declaration.start_byte, declaration.end_byte, f"{kind} {acc} = {_ZEROS[kind]};"))
            edits.append((loop.end_byte, loop.end_byte, f"\n{indent}{acc} += {start};"))
            continue
        name = next(f"{acc}_start{n or ''}" for n in range(len(taken) + 1) if f"{acc}_start{n or ''}" not in taken)
        taken.add(name)
        edits.append((declaration.start_byte, declaration.end_byte,
                      f"const {kind} {name} = {start};\n{indent}{kind} {acc} = {_ZEROS[kind]};"))
        edits.append((loop.end_byte, loop.end_byte, f"\n{indent}{acc} = {name} + {acc};"))
    return edits


def _changes_start(parsed: cp.ParsedSource, declaration: Node, loop: Node) -> bool:
    """Whether the start `declaration` gives its sum might read another value after `loop` than before it (see the
    module's docstring: `late`)."""
    start = declaration.children_by_field_name("declarator")[0].child_by_field_name("value")
    changes = cp.nodes_of_type(loop, "assignment_expression") + cp.nodes_of_type(loop, "update_expression")
    read = {parsed.text(node) for node in cp.nodes_of_type(start, "identifier")}
    return first_effect(parsed, start) is not None or first_effect(parsed, loop) is not None or \
        any(cp.nodes_of_type(start, kind) for kind in ("assignment_expression", "update_expression")) or \
        any((node.child_by_field_name("left") or node.child_by_field_name("argument")).type != "identifier"
            for node in changes) or bool(read & written_names(parsed, loop))


def _started_sum(parsed: cp.ParsedSource, declaration: Node, loop: Node) -> tuple[str, str, str] | None:
    """(the type, the sum's name, its start) where `declaration` starts a sum elsewhere than zero that `loop`, the
    statement after it, only adds to; else None."""
    if declaration.type != "declaration" or loop.type != "for_statement":
        return None
    declarators = declaration.children_by_field_name("declarator")
    kind = declared_kind(parsed, declaration) if declarators else ""
    if len(declarators) != 1 or declarators[0].type != "init_declarator" or kind not in _ZEROS:
        return None
    name, value = declarators[0].child_by_field_name("declarator"), declarators[0].child_by_field_name("value")
    if name is None or name.type != "identifier" or value is None or \
            ZERO.match(parsed.text(value).strip()):
        return None
    acc = parsed.text(name)
    mentions = [node for node in cp.nodes_of_type(loop, "identifier") if parsed.text(node) == acc]
    update = re.compile(_UPDATE.format(acc=re.escape(acc)))
    for node in mentions:
        statement = node
        while statement.parent is not None and statement.type != "expression_statement":
            statement = statement.parent
        found = update.fullmatch(" ".join(parsed.text(statement).split()))
        added = found and (found["e"] or found["f"])
        if not added or re.search(rf"\b{re.escape(acc)}\b", added) or \
                sum(parsed.text(n) == acc for n in cp.nodes_of_type(statement, "identifier")) != \
                (1 if found["e"] else 2):
            return None
    if not mentions or re.search(rf"&\s*{re.escape(acc)}\b", parsed.text(loop)):
        return None
    return kind, acc, " ".join(parsed.text(value).split())
