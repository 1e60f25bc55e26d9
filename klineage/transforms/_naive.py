"""Shared analysis for the forwards that place a mechanism on naive kernels (one thread per element or row):
which kernel an anchor names, the thread-index declaration, an element's work after its guard (either naive
form), the parameters' types, the launches that run a kernel and the plan with its first grid dimension rescaled.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import ArgKind, Launch, LaunchPlan
from klineage.transforms._canonical import NARROW, WIDE, canonical_index
from klineage.transforms._edit import indentation, is_written, operator, reindent, splice, unparen
from klineage.transforms.base import Anchor, NotApplicable, refused, with_plan

SERIAL_INDEX = canonical_index(NARROW)  # one thread per element or row
INDEXES = ((NARROW, SERIAL_INDEX), (WIDE, canonical_index(WIDE)))  # (type, initializer)
# the integer types a row loop's index may be declared with (`for (size_t j = 0; ...)`); the forwards keep it
LOOP_INDEX_TYPES = r"int|unsigned|unsigned int|uint32_t|size_t|uint64_t|long long|int64_t|long"
# a bound `n` of `i < n` a forward may copy into `i + 3 < n`: a name, or a product or sum of names (`rows * cols`)
BOUND = r"[A-Za-z_]\w*(?:\s*[*+]\s*[A-Za-z_]\w*)*"
# a loop's bound as people write it: BOUND, or one count cast to an integer type (`(size_t)n`,
# `static_cast<int64_t>(n)`), the same value as the count wherever the kernel is correct (a negative count would
# send the cast loop past every buffer); a cast product stays out (its width is its value)
INTEGER_CAST = rf"(?:\((?:{LOOP_INDEX_TYPES})\) ?|static_cast<(?:{LOOP_INDEX_TYPES})>)"  # C-style or static_cast
CAST_BOUND = rf"{INTEGER_CAST}\(?([A-Za-z_]\w*)\)?"
FLOAT_ZERO = r"(?:0|0\.0*f?|0\.f|\.0f?)"  # a float zero as people write it: 0, 0.0, 0.f, .0f, ...
# what an element's work may not hold: a loop, a barrier or collective, an early exit or a jump (a `continue` of a
# grid-stride loop read as one element: no loop is left for it), a thread coordinate
FORBIDDEN = re.compile(r"\b(?:__syncthreads\w*|__syncwarp|__shared__|__shfl\w*|__ballot\w*|__any_sync|__all_sync|"
                        r"__activemask|__match\w*|__reduce\w*|asm|goto|break|continue|return|for|while|do|threadIdx|"
                        r"blockIdx|blockDim|gridDim|this_grid|grid_group)\b")
# a bound `n` of `i < n` that needs no parentheses there: names, numbers, calls, casts and arithmetic
_BOUND_TYPES = frozenset({"identifier", "number_literal", "field_expression", "call_expression", "cast_expression",
                          "parenthesized_expression", "subscript_expression"})


@dataclass(frozen=True)
class ElementWork:
    """A 1-D kernel's element index, its guard and the work it guards, in either naive form."""

    function: cp.Function
    kind: str  # the index's type
    index: str
    init: str  # its initializer, as written
    init_node: Node
    bound: str
    start: int  # bytes [start, end) of the index declaration through the element's work
    end: int
    work: str  # the element's work as one block (the guarded statement, or the statements after the return)
    nodes: tuple[Node, ...]  # the guarded statement (`if (i < n) ...`) or the statements after `return`


def squash(text: str) -> str:
    """The text with every run of blanks one space: C's layout does not change what it says."""
    return " ".join(text.split())


def bound_of(text: str) -> str | None:
    """The bound `text` (squashed) says, without a cast on a lone count (CAST_BOUND); None where it is neither."""
    found = re.fullmatch(CAST_BOUND, text) or re.fullmatch(rf"({BOUND})", text)
    return found[1] if found else None


def uncast_grid(text: str) -> str:
    """`text` (squashed) without the integer casts people put on the grid's coordinates and extents
    (`(size_t)blockDim.x * gridDim.x`, `static_cast<int64_t>(blockIdx.x) * blockDim.x`): a grid-stride loop's
    start and step, read only to recognise them."""
    text = re.sub(rf"static_cast<(?:{LOOP_INDEX_TYPES})>\(((?:blockIdx|blockDim|gridDim)\.x)\)", r"\1", text)
    return re.sub(rf"\((?:{LOOP_INDEX_TYPES})\) ?(?=\(|blockIdx|blockDim|gridDim)", "", text)


def statements(node: Node) -> list[Node]:
    """The statements a block holds, comments left out; a lone statement is its own list."""
    return [c for c in node.named_children if c.type != "comment"] if node.type == "compound_statement" else [node]


T = TypeVar("T")


def readable(parsed: cp.ParsedSource, read: Callable[[cp.Function], T]) -> list[tuple[cp.Function, T]]:
    """(function, what `read` finds in it) for every function of `parsed` that `read` does not refuse."""
    found = []
    for function in cp.functions(parsed):
        try:
            found.append((function, read(function)))
        except NotApplicable as error:
            refused(function, error)
    return found


def kernel(parsed: cp.ParsedSource, anchor: Anchor) -> cp.Function:
    """The kernel (a `__global__` definition) the anchor names."""
    for function in cp.functions(parsed):
        if function.name == anchor.function and function.is_kernel and function.node.child_by_field_name("body"):
            return function
    raise NotApplicable(f"no kernel {anchor.function}")


def index_declaration(parsed: cp.ParsedSource, body: Node, value: str, kind: str = "int") -> tuple[Node, Node, str]:
    """(declaration, its initializer, the name) of `<kind> name = <value>;` among the body's statements."""
    for statement in statements(body):
        declarators = statement.children_by_field_name("declarator") if statement.type == "declaration" else []
        declared = statement.child_by_field_name("type")
        if len(declarators) != 1 or declarators[0].type != "init_declarator" or declared is None:
            continue
        init = declarators[0].child_by_field_name("value")
        if squash(parsed.text(declared)) == kind and init is not None and squash(parsed.text(init)) == value:
            return statement, init, parsed.text(declarators[0].child_by_field_name("declarator"))
    raise NotApplicable(f"no `{kind} i = {value};`")


def parameters(parsed: cp.ParsedSource, function: cp.Function) -> list[tuple[str, str, bool]]:
    """(name, type without `const`-free qualifiers squashed, is a pointer) of each parameter, in order."""
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    found = []
    for param in declarator.child_by_field_name("parameters").named_children:
        kind, inner = param.child_by_field_name("type"), param.child_by_field_name("declarator")
        name = inner
        while name is not None and name.type != "identifier":
            name = name.child_by_field_name("declarator")
        found.append((parsed.text(name) if name is not None else "", squash(parsed.text(kind)) if kind else "",
                      inner is not None and inner.type == "pointer_declarator"))
    return found


def launches_of(state: KernelState, entry: str, *, dimensions: int) -> list[Launch]:
    """The plan's launches of `entry`; NotApplicable unless there is one, each with a grid and block of at most
    `dimensions` dimensions, passing no buffer twice (the kernel may read what it writes elsewhere)."""
    launches = [launch for launch in state.plan.launches if launch.entry == entry]
    if not launches:
        raise NotApplicable(f"the plan never launches {entry}")
    for launch in launches:
        extra = [str(d).strip() for d in (*launch.grid[dimensions:], *launch.block[dimensions:])]
        if extra != ["1"] * len(extra):
            raise NotApplicable(f"{entry}'s launch has more than {dimensions} dimension(s)")
        buffers = [arg.name for arg in launch.args if arg.kind is ArgKind.BUFFER]
        if len(buffers) != len(set(buffers)):
            raise NotApplicable(f"{entry}'s launch passes one buffer twice")
    return launches


def rescaled_grid(state: KernelState, entry: str, rescale: Callable[[str], str]) -> LaunchPlan:
    """The plan with the first grid dimension of every launch of `entry` rewritten by `rescale` (which raises
    NotApplicable for a grid it cannot read)."""
    launches = []
    for launch in state.plan.launches:
        if launch.entry == entry:
            grid = rescale(str(launch.grid[0]).strip())
            launch = Launch(launch.entry, (grid, *launch.grid[1:]), launch.block, launch.shared, launch.args)
        launches.append(launch)
    return with_plan(state, launches=tuple(launches))


def tiled_plan(state: KernelState, function: cp.Function, rows: str, columns: str, tile: tuple[int, int],
               block: tuple[int, int]) -> LaunchPlan:
    """The plan with every launch of `function` given `block` and the grid (cdiv(C, tile[0]), cdiv(R, tile[1]), Z),
    C and R the values the launch passes for the kernel's scalar parameters `columns` and `rows`, Z the launch's own
    third dimension (a batch's matrices)."""
    parsed = cp.parse(state.source)
    launches = []
    for launch in state.plan.launches:
        if launch.entry == function.name:
            values = launch_scalars(parsed, function, launch)
            if rows not in values or columns not in values:
                raise NotApplicable(f"'{rows}' or '{columns}' is not passed to {function.name} as a scalar")
            grid = (f"cdiv({values[columns]}, {tile[0]})", f"cdiv({values[rows]}, {tile[1]})", launch.grid[2])
            launch = Launch(launch.entry, grid, (*block, 1), launch.shared, launch.args)
        launches.append(launch)
    return with_plan(state, launches=tuple(launches))


def launch_scalars(parsed: cp.ParsedSource, function: cp.Function, launch: Launch) -> dict[str, str]:
    """The kernel's scalar parameters -> what `launch` passes for each, as written."""
    names = [(name, pointer) for name, _, pointer in parameters(parsed, function)]
    if len(launch.args) != len(names):
        raise NotApplicable(f"{function.name}'s launch passes {len(launch.args)} arguments")
    return {name: str(arg.value).strip() for (name, pointer), arg in zip(names, launch.args, strict=True)
            if not pointer and arg.kind is ArgKind.SCALAR}


def unwrapped(grid: str, before: str, after: str) -> str:
    """The grid expression a forward wrapped as `before + grid + after`; NotApplicable when it is not so wrapped."""
    if not (grid.startswith(before) and grid.endswith(after) and len(grid) > len(before) + len(after)):
        raise NotApplicable(f"the grid {grid} is not {before}...{after}")
    return grid[len(before):-len(after)]


def typed_index(parsed: cp.ParsedSource, body: Node,
                initializer: Callable[[str], str] = dict(INDEXES).__getitem__) -> tuple[str, Node, Node, str]:
    """(type, declaration, initializer, name) of the first `<type> i = <initializer(type)>;` among the body's
    statements, the type int or long long (a 64-bit index as `_canonical` spells it)."""
    for kind, _ in INDEXES:
        try:
            return (kind, *index_declaration(parsed, body, initializer(kind), kind))
        except NotApplicable:
            continue
    raise NotApplicable(f"no `int i = {initializer(NARROW)};` nor its 64-bit form")


def declared_index(parsed: cp.ParsedSource, body: Node) -> tuple[Node, Node, str, str]:
    """(declaration, initializer, type, name) of the thread's element index, not `const`."""
    kind, declaration, init, index = typed_index(parsed, body)
    if any(c.type == "type_qualifier" for c in declaration.children):
        raise NotApplicable(f"the element index '{index}' is const")
    return declaration, init, kind, index


def element_work(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> ElementWork:
    """The element work of a 1-D elementwise kernel, `if (i < n) <work>` ending the kernel or `if (i >= n)
    return;` followed by it; NotApplicable with the reason for any other kernel, or work that loops,
    synchronizes, returns, names a thread coordinate or changes the index. The launch passes no buffer twice."""
    if not function.is_kernel or function.node.child_by_field_name("body") is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    launches_of(state, function.name, dimensions=1)
    body = function.node.child_by_field_name("body")
    if "gridDim" in parsed.text(body):
        raise NotApplicable(f"{function.name} names gridDim already")
    declaration, init, kind, index = declared_index(parsed, body)
    listed = statements(body)
    at = listed.index(declaration)
    if at + 1 >= len(listed) or listed[at + 1].type != "if_statement":
        raise NotApplicable(f"{function.name}: no guard right after its element index")
    guard = listed[at + 1]
    condition = guard.child_by_field_name("condition")
    comparison = unparen(condition.child_by_field_name("value") or condition)
    relation = operator(comparison) if comparison.type == "binary_expression" else ""
    sides = [comparison.child_by_field_name(side) for side in ("left", "right")] if relation else []
    if relation in (">", "<=") and parsed.text(sides[1]) == index:  # `n > i` is `i < n`, `n <= i` is `i >= n`
        relation, sides = {">": "<", "<=": ">="}[relation], sides[::-1]
    if relation not in ("<", ">=") or parsed.text(sides[0]) != index or \
            guard.child_by_field_name("alternative") is not None:
        raise NotApplicable(f"{function.name}'s guard is not `{index} < n` or `{index} >= n`")
    bound = sides[1]
    if not _simple(bound):
        raise NotApplicable(f"{function.name}'s bound `{parsed.text(bound)}` is no plain arithmetic")
    consequence = guard.child_by_field_name("consequence")
    if relation == "<" and at + 2 == len(listed):
        work_nodes, work = [consequence], parsed.text(consequence)
    elif relation == ">=" and squash(parsed.text(consequence)) in ("return;", "{ return; }") and at + 2 < len(listed):
        work_nodes = listed[at + 2:]
        column = len(indentation(parsed.data, work_nodes[0].start_byte))
        inner = indentation(parsed.data, declaration.start_byte) + "    "
        lines = parsed.data[work_nodes[0].start_byte:work_nodes[-1].end_byte].decode("utf-8")
        work = "{\n" + inner + reindent(lines, column, inner)[len(inner):] + "\n" + inner[:-4] + "}"
    else:
        raise NotApplicable(f"{function.name}: the guard neither ends the kernel (`if ({index} < n)`) nor returns "
                            f"(`if ({index} >= n) return;`)")
    for node in work_nodes:
        text = parsed.text(node)
        if found := FORBIDDEN.search(text):
            raise NotApplicable(f"{function.name}'s element work loops, synchronizes, returns or names a thread "
                                f"coordinate (`{found[0]}`)")
        if any(parsed.text(n) == index and is_written(n) for n in cp.nodes_of_type(node, "identifier")) or \
                re.search(rf"&\s*{index}\b", text):
            raise NotApplicable(f"{function.name} changes its element index '{index}'")
    end = work_nodes[-1].end_byte
    return ElementWork(function, kind, index, parsed.text(init), init, parsed.text(bound), declaration.start_byte,
                       end, work, tuple(work_nodes))


def if_form(state: KernelState) -> KernelState:
    """`state` with each elementwise kernel in the `return` form (`if (i >= n) return;` and the element's work
    after it) rewritten to the `if` form (`if (i < n) { the work }`), which computes the same: the work is the
    rest of the kernel. The same state when no kernel is in the `return` form."""
    parsed = cp.parse(state.source)
    edits = []
    for _, work in readable(parsed, lambda f: element_work(state, parsed, f)):
        guard = work.nodes[0].prev_named_sibling  # of the `if` form's work: the if's own condition
        if guard is None or guard.type != "if_statement":
            continue
        edits.append((guard.start_byte, work.end, f"if ({work.index} < {work.bound}) {work.work}"))
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _simple(bound: Node) -> bool:
    if bound.type == "binary_expression":
        return operator(bound) in ("*", "+", "-", "/", "%") and all(
            _simple(bound.child_by_field_name(side)) for side in ("left", "right"))
    return bound.type in _BOUND_TYPES


def grid_index(parsed: cp.ParsedSource, node: Node) -> tuple[str, str]:
    """(axis, name) of `int name = blockIdx.a * blockDim.a + threadIdx.a;` (canonical, `_canonical`), else ("", "")."""
    match = re.fullmatch(r"int ([A-Za-z_]\w*) = blockIdx\.([xyz]) \* blockDim\.\2 \+ threadIdx\.\2;",
                         squash(parsed.text(node)))
    return (match[2], match[1]) if match else ("", "")


def bounds_2d(condition: str, row: str, column: str, relation: str = "<", joined: str = "&&") -> tuple[str, str] | None:
    """(M, N) of `r < M && c < N` (relation `<`, joined `&&`; either order), or of `r >= M || c >= N`; else None."""
    for first, second in ((row, column), (column, row)):
        match = re.fullmatch(rf"{first} {relation} ([A-Za-z_]\w*) {re.escape(joined)} {second} {relation} "
                             rf"([A-Za-z_]\w*)", condition)
        if match:
            return (match[1], match[2]) if first == row else (match[2], match[1])
    return None
