"""A thread per row that loops over the row's output columns, each column's work its own (a linear layer written
row by row), read as the 2-D form of one thread per output that `untile_matmul` reads:

    int r = blockIdx.x * blockDim.x + threadIdx.x;          int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= M) return;                              ->     int r = blockIdx.y * blockDim.y + threadIdx.y;
    for (int c = 0; c < N; ++c) { <work> }                  if (r < M && c < N) { <work> }

(the guard may wrap the loop instead: `if (r < M) { for ... }`). The columns then run in parallel where they ran one
after another, which computes the same wherever no column reads what another wrote: the work assigns nothing
declared outside it, and every array it writes is touched, in the whole kernel, at one subscript only, which names
the column (`y[r * N + c]`), and it calls nothing with an effect. Anything else is left as written.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._calls import first_effect
from klineage.transforms._canonical import NARROW, canonical, canonical_index
from klineage.transforms._edit import is_written, unparen
from klineage.transforms._matmul import written
from klineage.transforms._naive import grid_index, parameters, squash, statements
from klineage.transforms.base import NotApplicable

_ID = r"([A-Za-z_]\w*)"
_COLUMNS = re.compile(rf"^for \(int {_ID} = 0; \1 < {_ID}; (?:\+\+\1|\1\+\+|\1 \+= 1)\)$")


def columns_threaded(parsed: cp.ParsedSource, function: cp.Function, state: KernelState) -> KernelState:
    """The state with the kernel's row of columns (above) written as one thread per output, or NotApplicable."""
    listed = statements(function.node.child_by_field_name("body")) if function.is_kernel else []
    axis, row = grid_index(parsed, listed[0]) if listed else ("", "")
    if axis != "x" or len(listed) < 2:
        raise NotApplicable("no thread per row on x")
    loop, rows = _guarded_loop(parsed, listed[1:], row)
    head = squash(parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte].decode())
    columns = _COLUMNS.match(head)
    body = loop.child_by_field_name("body")
    if columns is None or body.type != "compound_statement":
        raise NotApplicable(f"`{head}` is not a loop over the row's columns from 0")
    column, count = columns.groups()
    scalars = {name for name, kind, pointer in parameters(parsed, function) if not pointer and kind == "int"}
    if {rows, count} - scalars or rows == count:
        raise NotApplicable(f"{rows} and {count} are not two int parameters")
    _check_independent(parsed, function, body, row, column)
    work = statements(body)
    lines = [f"int {column} = {canonical_index(NARROW, 'x')};", f"int {row} = {canonical_index(NARROW, 'y')};",
             f"if ({row} < {rows} && {column} < {count}) {{"]
    return canonical(KernelState(source=written(parsed, function, lines, work, 1), plan=state.plan))


def _guarded_loop(parsed: cp.ParsedSource, rest: list[Node], row: str) -> tuple[Node, str]:
    """(the loop over the columns, M) of `if (r >= M) return; <loop>` or `if (r < M) { <loop> }`."""
    guard = rest[0]
    if guard.type != "if_statement" or guard.child_by_field_name("alternative") is not None:
        raise NotApplicable(f"no guard on {row} after it")
    condition = squash(parsed.text(guard.child_by_field_name("condition")))
    consequence = guard.child_by_field_name("consequence")
    leaves = re.fullmatch(rf"\({row} >= {_ID}\)", condition)
    if leaves and squash(parsed.text(consequence)) in ("return;", "{ return; }") and len(rest) == 2:
        loop, rows = rest[1], leaves[1]
    else:
        inside = re.fullmatch(rf"\({row} < {_ID}\)", condition)
        inner = statements(consequence) if consequence.type == "compound_statement" else [consequence]
        if not inside or len(rest) != 1 or len(inner) != 1:
            raise NotApplicable(f"the guard is not `{row} >= M` returning before one loop (or `{row} < M` around it)")
        loop, rows = inner[0], inside[1]
    if loop.type != "for_statement":
        raise NotApplicable("the row's work is not one loop over its columns")
    return loop, rows


def _check_independent(parsed: cp.ParsedSource, function: cp.Function, body: Node, row: str, column: str) -> None:
    """NotApplicable unless no column's work can see another's: it calls nothing with an effect (an atomic would add
    a row's columns in another order), assigns only what it declares and array elements, and each array it writes is
    touched in the kernel at one subscript only, naming the column."""
    if effect := first_effect(parsed, body):
        raise NotApplicable(f"a column's work calls {effect}, which may have an effect")
    declared = {parsed.text(n) for n in cp.nodes_of_type(body, "identifier")
                if n.parent is not None and n.parent.type in ("init_declarator", "declaration")}
    subscripts: dict[str, set[str]] = {}
    for change in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = unparen(change.child_by_field_name("left") or change.child_by_field_name("argument"))
        if target.type == "subscript_expression":
            subscripts[parsed.text(target.child_by_field_name("argument"))] = set()
        elif target.type != "identifier" or parsed.text(target) not in declared:
            raise NotApplicable(f"a column's work assigns `{squash(parsed.text(target))}`, which outlives it")
    if any(is_written(n) for n in cp.nodes_of_type(function.node, "identifier") if parsed.text(n) == row) or \
            any(is_written(n) for n in cp.nodes_of_type(body, "identifier") if parsed.text(n) == column):
        raise NotApplicable(f"{row}, or {column} inside its loop, is assigned")
    for node in cp.nodes_of_type(function.node, "subscript_expression"):
        array = parsed.text(node.child_by_field_name("argument"))
        if array in subscripts:
            subscripts[array].add(squash(parsed.text(node.child_by_field_name("indices"))))
    for array, places in subscripts.items():
        if len(places) != 1 or not re.search(rf"\b{column}\b", next(iter(places))):
            raise NotApplicable(f"{array} is written and touched at {len(places)} places, or not at its column's")

