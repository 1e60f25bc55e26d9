"""A kernel's grid-stride loop over elements, read once for the transforms that rewrite one.

People write it two ways:

    for (<type> i = <start>; i < n; i += <stride>) <work>
    <type> i = <start>; while (i < n) { <work> i += <stride>; }

<start> is the global thread index `blockIdx.x * blockDim.x + threadIdx.x` (its terms and factors in either order,
casts on the grid allowed); <stride> is the grid's extent in threads, `blockDim.x * gridDim.x` (either order,
parenthesized or cast), or a local declared as that extent before the loop and never assigned; the step may be
spelled `i = i + <stride>`. `read_grid_stride` reads the header and refuses anything else with its reason; what a
transform then asks of the work, the bound and the statements around the loop is its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._edit import is_written, operator, unparen
from klineage.transforms._naive import LOOP_INDEX_TYPES, squash, statements, uncast_grid
from klineage.transforms.base import NotApplicable

_PRODUCT = r"(?:\(?blockIdx\.x\)? \* blockDim\.x|blockDim\.x \* \(?blockIdx\.x\)?)"
GLOBAL_INDEX = re.compile(rf"{_PRODUCT} \+ threadIdx\.x|threadIdx\.x \+ {_PRODUCT}")  # uncast and squashed
GRID_STRIDES = ("blockDim.x * gridDim.x", "gridDim.x * blockDim.x")  # a grid-stride loop's step, either order


def stride_local(parsed: cp.ParsedSource, statement: Node) -> str | None:
    """The name `statement` declares as the grid's extent in threads (`int stride = blockDim.x * gridDim.x;`, the
    casts on the grid read through), or None."""
    declared = re.fullmatch(rf"(?:const )?(?:{LOOP_INDEX_TYPES}) ([A-Za-z_]\w*) = "
                            rf"\(?({'|'.join(map(re.escape, GRID_STRIDES))})\)?;",
                            uncast_grid(squash(parsed.text(statement))))
    return declared[1] if declared else None


@dataclass(frozen=True)
class GridStrideLoop:
    loop: Node  # the `for` or `while` statement
    kind: str  # the index's type, as declared
    index: str
    start: str  # the index's initial value, as written (casts kept)
    start_node: Node  # where that value stands: in the `for` loop's initializer, or the `while` loop's declaration
    bound: Node  # n in `i < n`
    stride: str  # the step's stride, as written
    step: Node | None  # the `while` loop's step: its body's last statement
    body: Node
    work: str  # the body's text, the `while` loop's step cut out
    before: tuple[Node, ...]  # the kernel's statements before the loop, the `while` loop's declaration left out


def grid_stride_candidates(parsed: cp.ParsedSource, listed: list[Node]) -> list[Node]:
    """The loops among `listed` whose header looks like a grid-stride loop's (a `for` loop whose initializer names
    threadIdx, a `while (i < ...)` whose index is declared from threadIdx before it): what `read_grid_stride` reads."""
    found = []
    for node in listed:
        if node.type == "for_statement":
            initializer = node.child_by_field_name("initializer")
            if initializer is not None and "threadIdx" in parsed.text(initializer):
                found.append(node)
        elif node.type == "while_statement":
            index = re.match(r"\(\s*([A-Za-z_]\w*) <", squash(parsed.text(node.child_by_field_name("condition"))))
            if index and any(re.fullmatch(rf"(?:{LOOP_INDEX_TYPES}) {index[1]} = .*threadIdx\.x.*;",
                                          squash(parsed.text(s))) for s in listed[:listed.index(node)]):
                found.append(node)
    return found


def read_grid_stride(parsed: cp.ParsedSource, function: cp.Function, listed: list[Node],
                     loop: Node) -> GridStrideLoop:
    """`loop`, one of the kernel body's statements `listed`, read as a grid-stride loop over elements, or
    NotApplicable with the reason."""
    before = listed[:listed.index(loop)]
    body = loop.child_by_field_name("body")
    if loop.type == "for_statement":
        declaration = loop.child_by_field_name("initializer")
        condition = loop.child_by_field_name("condition")
        update = loop.child_by_field_name("update")
        step, last_work, step_text = None, None, squash(parsed.text(update)) if update is not None else ""
    elif loop.type == "while_statement":
        condition = loop.child_by_field_name("condition").child_by_field_name("value")
        inside = statements(body) if body.type == "compound_statement" else []
        if len(inside) < 2:
            raise NotApplicable(f"{function.name}'s `while` loop is not its work and then its step")
        step, last_work = inside[-1], inside[-2]
        step_text = squash(parsed.text(step)).removesuffix(";")
        declaration = _while_declaration(parsed, function, before, condition)
        before = [s for s in before if s is not declaration]
    else:
        raise NotApplicable(f"{function.name}'s statement is not a `for` or `while` loop")
    declared = (re.fullmatch(rf"({LOOP_INDEX_TYPES}) ([A-Za-z_]\w*) = (.+);", squash(parsed.text(declaration)))
                if declaration is not None and declaration.type == "declaration" else None)
    if declared is None or not GLOBAL_INDEX.fullmatch(uncast_grid(declared[3])):
        raise NotApplicable(f"{function.name}'s loop does not start at the global thread index "
                            f"`blockIdx.x * blockDim.x + threadIdx.x`")
    kind, index, start = declared.groups()
    condition = unparen(condition) if condition is not None else None
    left = condition.child_by_field_name("left") if condition is not None and condition.type == "binary_expression" \
        else None
    if left is None or operator(condition) != "<" or parsed.text(unparen(left)) != index:
        raise NotApplicable(f"{function.name}'s loop is not `{index} < n; {index} += blockDim.x * gridDim.x`: its "
                            f"condition is not `{index} < n`")
    if any(parsed.text(n) == index and is_written(n) for statement in before
           for n in cp.nodes_of_type(statement, "identifier")):
        raise NotApplicable(f"{function.name} changes its index '{index}' before the loop")
    work = parsed.text(body) if step is None else \
        (parsed.data[body.start_byte:last_work.end_byte] + parsed.data[step.end_byte:body.end_byte]).decode("utf-8")
    return GridStrideLoop(loop, kind, index, start,
                          declaration.children_by_field_name("declarator")[0].child_by_field_name("value"),
                          condition.child_by_field_name("right"), _stride(parsed, function, before, step_text, index),
                          step, body, work, tuple(before))


def _while_declaration(parsed: cp.ParsedSource, function: cp.Function, before: list[Node],
                       condition: Node) -> Node:
    """The last statement before a `while` loop that declares the index its condition compares."""
    left = unparen(condition).child_by_field_name("left") if unparen(condition).type == "binary_expression" else None
    index = parsed.text(unparen(left)) if left is not None else ""
    declared = [s for s in before if index and re.fullmatch(rf"(?:{LOOP_INDEX_TYPES}) {re.escape(index)} = .+;",
                                                            squash(parsed.text(s)))]
    if not declared:
        raise NotApplicable(f"{function.name}'s `while` loop compares no index declared before it")
    return declared[-1]


def _stride(parsed: cp.ParsedSource, function: cp.Function, before: list[Node], step: str, index: str) -> str:
    """The stride of the loop's step `i += <stride>` (`i = i + <stride>`) as written: the grid's extent, or a local
    declared before the loop as that extent and never assigned."""
    strides = set(GRID_STRIDES) | {name for statement in before if (name := stride_local(parsed, statement))}
    body = function.node.child_by_field_name("body")
    assigned = {parsed.text(n) for n in cp.nodes_of_type(body, "identifier") if is_written(n)}
    found = re.fullmatch(rf"{re.escape(index)} (?:\+= |= {re.escape(index)} \+ )(.+)", step)
    stride = found[1] if found else ""
    if uncast_grid(stride) not in strides and re.fullmatch(r"\((.+)\)", stride):
        stride = stride[1:-1]  # `i += (blockDim.x * gridDim.x)`
    if uncast_grid(stride) not in strides or stride in assigned:
        raise NotApplicable(f"{function.name}'s loop is not `{index} < n; {index} += blockDim.x * gridDim.x`: its "
                            f"step is not the grid's extent")
    return stride
