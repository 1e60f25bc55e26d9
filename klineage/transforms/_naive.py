"""Shared analysis for the forwards that place a mechanism on naive kernels (one thread per element or row):
which kernel an anchor names, the thread-index declaration, the scalar locals declared between it and the guard,
an element's work after its guard (either naive form), the parameters' types, the launches that run a kernel and
the plan with its first grid dimension rescaled.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.launch import ArgKind, Launch, LaunchPlan
from klineage.transforms._calls import MATH_CALLS, first_effect
from klineage.transforms._canonical import NARROW, WIDE, canonical_index
from klineage.transforms._edit import (
    declared_names,
    indentation,
    is_written,
    operator,
    own_lines,
    params,
    reindent,
    splice,
    unparen,
    written_names,
)
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
# what a local declared before the guard may be initialized with: arithmetic on names and literals, casts, `sizeof`
# and calls of pure math (no memory read, no effect, no thread coordinate: `threadIdx.x` is a field expression)
_LOCAL_VALUE = frozenset({"identifier", "number_literal", "char_literal", "true", "false", "binary_expression",
                          "unary_expression", "parenthesized_expression", "conditional_expression", "cast_expression",
                          "type_descriptor", "primitive_type", "sized_type_specifier", "type_identifier",
                          "type_qualifier", "call_expression", "argument_list", "template_function",
                          "template_argument_list", "sizeof_expression", "comment"})
_LOCAL_CALLS = MATH_CALLS - {"__ldg"}  # math that reads no memory
_COUNT_OPERATORS = frozenset({"*", "+", "-", "/", "%"})


@dataclass(frozen=True)
class Local:
    """A scalar local declared before the element index or between it and its guard (`int cols = ca + cb;`)."""

    node: Node  # its declaration
    names: tuple[str, ...]
    integer: bool  # of an integer type (a row length may be one)
    indexed: bool  # its value names the element index or reads memory, directly or through another such local:
    # `sunk` moves it into the element's work
    between: bool  # declared between the index and the guard (else before the index)


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
    guard: Node
    locals: tuple[Local, ...]  # declared before the index or between it and the guard, none naming the index


def squash(text: str) -> str:
    """The text with every run of blanks one space: C's layout does not change what it says."""
    return " ".join(text.split())


def bound_of(text: str) -> str | None:
    """The bound `text` (squashed) says, without a cast on a lone count (CAST_BOUND) or the parentheses a macro puts
    around its argument (`i < (n)`); None where it is neither."""
    found = re.fullmatch(CAST_BOUND, text) or re.fullmatch(rf"\(?({BOUND})\)?", text)
    return found[1] if found and text.count("(") == text.count(")") else None


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


def grid_extent_parameters(state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                           axis: int) -> tuple[set[str], set[str]]:
    """(the kernel's scalar parameters that every launch of it passes its grid's extent along `axis` as, the extents
    the launches give): `rows` where each grid is (..., rows) and `rows` is passed for the parameter `rows`."""
    found: set[str] | None = None
    extents = set()
    for launch in state.plan.launches:
        if launch.entry == function.name:
            extent = str(launch.grid[axis]).strip()
            extents.add(extent)
            passed = {name for name, value in launch_scalars(parsed, function, launch).items() if value == extent}
            found = passed if found is None else found & passed
    return found or set(), extents


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
    return;` followed by it, scalar locals (`scalar_locals`) maybe declared before the index or between it and
    the guard;
    NotApplicable with the reason for any other kernel, a local naming the index (`sunk` moves those into the
    work), a bound the kernel assigns (a loop's condition would read it again), or work that loops, synchronizes,
    returns, names a thread coordinate or changes the index. The launch passes no buffer twice."""
    if not function.is_kernel or function.node.child_by_field_name("body") is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    launches_of(state, function.name, dimensions=1)
    body = function.node.child_by_field_name("body")
    if "gridDim" in parsed.text(body):
        raise NotApplicable(f"{function.name} names gridDim already")
    declaration, init, kind, index = declared_index(parsed, body)
    listed = statements(body)
    at = listed.index(declaration)
    found = scalar_locals(parsed, function, listed, at, index)
    if indexed := [local for local in found if local.indexed]:
        raise NotApplicable(f"{function.name}'s local '{indexed[0].names[0]}' before the guard names the element "
                            f"index '{index}'")
    at += len(between(found))
    if at + 1 >= len(listed) or listed[at + 1].type != "if_statement":
        raise NotApplicable(f"{function.name}: no guard right after its element index and its locals")
    guard = listed[at + 1]
    relation, bound = compared(parsed, guard, index)
    if relation not in ("<", ">=") or guard.child_by_field_name("alternative") is not None:
        raise NotApplicable(f"{function.name}'s guard is not `{index} < n` or `{index} >= n`")
    if not _simple(bound):
        raise NotApplicable(f"{function.name}'s bound `{parsed.text(bound)}` is no plain arithmetic")
    _check_unassigned(parsed, function, bound)
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
        if found_word := FORBIDDEN.search(text):
            raise NotApplicable(f"{function.name}'s element work loops, synchronizes, returns or names a thread "
                                f"coordinate (`{found_word[0]}`)")
        if any(parsed.text(n) == index and is_written(n) for n in cp.nodes_of_type(node, "identifier")) or \
                re.search(rf"&\s*{index}\b", text):
            raise NotApplicable(f"{function.name} changes its element index '{index}'")
    end = work_nodes[-1].end_byte
    return ElementWork(function, kind, index, parsed.text(init), init, parsed.text(bound), declaration.start_byte,
                       end, work, tuple(work_nodes), guard, found)


def compared(parsed: cp.ParsedSource, guard: Node, index: str) -> tuple[str, Node | None]:
    """(relation, bound) of a guard `if (i < n)` or `if (i >= n)` (`n > i` read as `i < n`, `n <= i` as `i >= n`);
    ("", None) for any other condition."""
    condition = guard.child_by_field_name("condition")
    comparison = unparen(condition.child_by_field_name("value") or condition)
    relation = operator(comparison) if comparison.type == "binary_expression" else ""
    if not relation:
        return "", None
    sides = [comparison.child_by_field_name(side) for side in ("left", "right")]
    if relation in (">", "<=") and parsed.text(sides[1]) == index:
        relation, sides = {">": "<", "<=": ">="}[relation], sides[::-1]
    return (relation, sides[1]) if parsed.text(sides[0]) == index else ("", None)


def scalar_locals(parsed: cp.ParsedSource, function: cp.Function, listed: list[Node], at: int,
                  index: str) -> tuple[Local, ...]:
    """The declarations before the element index (`listed[at]`) and right after it up to the first other statement,
    each a scalar local (`int cols = ca + cb;`, `const float one = 1.f;`, `int r = i / cols;`) whose value is
    arithmetic, casts and pure math on literals, scalar parameters, the source's constants, the index and earlier
    such locals (and, read from a `const` pointer parameter, `float s = scale[0];`: `_constant_reads`, a local
    `sunk` moves into the work); NotApplicable for anything else before the index, or a local that may read other
    memory, have an effect or name a thread coordinate (a lane or iteration would not be the thread it was), that
    the kernel assigns, takes the address of or declares again, or that names a parameter. Evaluated where they
    stand or later, before every element or once per element, such locals hold the same values."""
    body = function.node.child_by_field_name("body")
    params = parameters(parsed, function)
    known = {name for name, _, pointer in params if not pointer} | set(parse_constants(parsed.source))
    changed = written_names(parsed, body) | {parsed.text(n.child_by_field_name("argument"))
                                             for n in cp.nodes_of_type(body, "pointer_expression")
                                             if parsed.text(n).startswith("&")}
    declared = declared_names(parsed, body)
    after = next((k for k, s in enumerate(listed[at + 1:], at + 1) if s.type != "declaration"), len(listed))
    found, indexed = [], {index}
    for statement in listed[:at] + listed[at + 1:after]:
        after_index = statement.start_byte > listed[at].start_byte
        if after_index:
            known.add(index)
        local = _local(parsed, function, statement, known, indexed, after_index)
        for name in local.names:
            if name in changed or declared.count(name) > 1 or any(name == p for p, _, _ in params):
                raise NotApplicable(f"{function.name}'s local '{name}' before the guard is assigned, has its address "
                                    f"taken, is declared again or names a parameter")
        found.append(local)
    return tuple(found)


def between(found: tuple[Local, ...]) -> tuple[Local, ...]:
    """The locals of `scalar_locals` declared between the index and the guard."""
    return tuple(local for local in found if local.between)


def _local(parsed: cp.ParsedSource, function: cp.Function, statement: Node, known: set[str], indexed: set[str],
           after_index: bool) -> Local:
    """One declaration of `scalar_locals`; adds its names to `known` (and to `indexed` where it names one)."""
    shown = squash(parsed.text(statement))
    if statement.type != "declaration":
        raise NotApplicable(f"{function.name} runs `{shown[:60]}` before its element index")
    kind = statement.child_by_field_name("type")
    declarators = statement.children_by_field_name("declarator")
    qualifiers = {parsed.text(c) for c in statement.named_children if c.type == "type_qualifier"}
    others = [c for c in statement.named_children if c.type not in ("type_qualifier", "comment") and c != kind and
              c not in declarators]
    if kind is None or kind.type not in ("primitive_type", "sized_type_specifier") or \
            qualifiers - {"const", "constexpr"} or others:
        raise NotApplicable(f"{function.name} declares `{shown}` before its guard: no scalar local")
    names, reads, memory = [], set(), False
    for declarator in declarators:
        value = declarator.child_by_field_name("value") if declarator.type == "init_declarator" else None
        name = declarator.child_by_field_name("declarator") if value is not None else None
        if name is None or name.type != "identifier":
            raise NotApplicable(f"{function.name} declares `{shown}` before its guard: no initialized scalar")
        reads_of = _constant_reads(parsed, function, value)
        strange = next((n.type for n in _named(value) if n.type not in _LOCAL_VALUE and n.id not in reads_of), None)
        if strange is not None or first_effect(parsed, value, _LOCAL_CALLS) is not None:
            raise NotApplicable(f"{function.name}'s local '{parsed.text(name)}' before the guard may read memory, "
                                f"have an effect or name a thread coordinate (`{parsed.text(value)}`)")
        callees = {n.start_byte for call in cp.nodes_of_type(value, "call_expression")
                   for n in cp.nodes_of_type(call.child_by_field_name("function"), "identifier")}
        uses = {parsed.text(n) for n in cp.nodes_of_type(value, "identifier")
                if n.start_byte not in callees and n.id not in reads_of}
        memory = memory or bool(reads_of)
        if unknown := sorted(uses - known):
            raise NotApplicable(f"{function.name}'s local '{parsed.text(name)}' before the guard reads '{unknown[0]}', "
                                f"no scalar parameter, constant, the index or an earlier such local")
        reads |= uses
        names.append(parsed.text(name))
        known.add(names[-1])
    moves = memory or bool(reads & indexed)
    if moves:
        indexed.update(names)
    integer = not re.search(r"\b(?:float|double|bool|char)\b", parsed.text(kind))
    return Local(statement, tuple(names), integer, moves, after_index)


def _constant_reads(parsed: cp.ParsedSource, function: cp.Function, value: Node) -> set[int]:
    """The ids of the nodes of `value` that read an element of a `const` pointer parameter (`scale[0]`, `*scale`,
    `scale[row]`: the subscript, its brackets and the pointer's name, not the subscript's own terms) in a kernel
    without `const_cast`: memory nothing in the launch writes (it passes no buffer twice), so the read gives the same
    value wherever in the thread it is made. NotApplicable where `value` reads any other memory."""
    constant = set() if "const_cast" in parsed.text(function.node) else {
        param.name for param in params(parsed, function.node)
        if param.indirection == "*" and re.match(r"(?:const\b|\w+\s+const\b)", squash(parsed.text(param.node)))}
    found: set[int] = set()
    for node in _named(value):
        if node.type == "subscript_expression" or (node.type == "pointer_expression" and
                                                   parsed.text(node).lstrip().startswith("*")):
            argument = unparen(node.child_by_field_name("argument"))
            if argument.type != "identifier" or parsed.text(argument) not in constant:
                raise NotApplicable(f"{function.name}'s local before the guard reads `{parsed.text(node)}`: memory "
                                    f"the launch may write")
            found |= {node.id, argument.id, *(c.id for c in node.children if c.type == "subscript_argument_list")}
    return found


def subscripted(parsed: cp.ParsedSource, function: cp.Function, nodes: list[Node]) -> str:
    """The text of the statements `nodes` (one run of them), each `*p` of a pointer parameter p of `function` written
    `p[0]`: the same element, as a subscript, the form the row and elementwise readers read."""
    pointers = {name for name, _, pointer in parameters(parsed, function) if pointer}
    start, end = nodes[0].start_byte, nodes[-1].end_byte
    edits = [(n.start_byte - start, n.end_byte - start, f"{parsed.text(n.child_by_field_name('argument'))}[0]")
             for node in nodes for n in cp.nodes_of_type(node, "pointer_expression")
             if parsed.text(n.child_by_field_name("operator")) == "*"
             and parsed.text(unparen(n.child_by_field_name("argument"))) in pointers
             and unparen(n.child_by_field_name("argument")).type == "identifier"]
    return splice(parsed.data[start:end], edits)[0].decode("utf-8")


def _named(node: Node) -> Iterator[Node]:
    yield node
    for child in node.named_children:
        yield from _named(child)


def _check_unassigned(parsed: cp.ParsedSource, function: cp.Function, bound: Node) -> None:
    """NotApplicable where the kernel assigns a name of the guard's bound: a forward's loop or tail reads the bound
    again after the work ran."""
    body = function.node.child_by_field_name("body")
    if assigned := sorted({parsed.text(n) for n in cp.nodes_of_type(bound, "identifier")} &
                          written_names(parsed, body)):
        raise NotApplicable(f"{function.name} assigns '{assigned[0]}' of its bound")


def copied_bound(parsed: cp.ParsedSource, function: cp.Function, bound: Node, found: tuple[Local, ...]) -> str | None:
    """The guard's bound as the packed forms copy it into their conditions: a name, a product or sum of names, a
    cast count (`bound_of`), or integer arithmetic (`+ - * / %`, parentheses, integer casts) on literals, scalar
    parameters, the source's constants and the kernel's scalar locals (`rows * (ca + cb)`, `(long long)rows * cols`);
    None for any other bound, and NotApplicable for one the kernel assigns."""
    _check_unassigned(parsed, function, bound)
    text = squash(parsed.text(bound))
    scalars = {name for name, _, pointer in parameters(parsed, function) if not pointer}
    names = scalars | set(parse_constants(parsed.source)) | {n for local in found for n in local.names}
    return bound_of(text) or (text if _count(parsed, bound, names) else None)


def _count(parsed: cp.ParsedSource, node: Node, names: set[str]) -> bool:
    node = unparen(node)
    if node.type == "cast_expression" and re.fullmatch(LOOP_INDEX_TYPES, squash(parsed.text(
            node.child_by_field_name("type")))):  # `(long long)rows * cols`: a count formed in 64 bits
        return _count(parsed, node.child_by_field_name("value"), names)
    if node.type == "binary_expression":
        return operator(node) in _COUNT_OPERATORS and all(_count(parsed, node.child_by_field_name(side), names)
                                                           for side in ("left", "right"))
    return node.type == "number_literal" or (node.type == "identifier" and parsed.text(node) in names)


def sunk(state: KernelState) -> KernelState:
    """`state` with each elementwise kernel's locals that name its element index, declared between the index and
    the guard (`int r = i / cols;`), moved past the guard to start the element's work, in their order: they have
    no effect and the guard does not read them, so every element in bounds computes the same, and the forwards
    read them as the work's (once per lane, once per iteration). The same state where no kernel has one."""
    parsed = cp.parse(state.source)
    edits = []
    for function in cp.functions(parsed):
        edits += _sinking(parsed, function)
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _sinking(parsed: cp.ParsedSource, function: cp.Function) -> list[tuple[int, int, str]]:
    """The edits that move the kernel's indexed locals past its guard; none where it has none, or its guard reads
    one, or it is no elementwise kernel (element_work says why)."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        return []
    try:
        declaration, _, _, index = declared_index(parsed, body)
        listed = statements(body)
        found = between(scalar_locals(parsed, function, listed, listed.index(declaration), index))
    except NotApplicable:
        return []
    moved = [local for local in found if local.indexed]
    after = listed.index(declaration) + len(found) + 1 if moved else len(listed)
    guard = listed[after] if after < len(listed) else None
    if guard is None or guard.type != "if_statement" or {n for local in moved for n in local.names} & {
            parsed.text(n) for n in cp.nodes_of_type(guard.child_by_field_name("condition"), "identifier")}:
        return []
    consequence = guard.child_by_field_name("consequence")
    returns = squash(parsed.text(consequence)) in ("return;", "{ return; }")
    indent = indentation(parsed.data, guard.start_byte)
    if not returns and guard != listed[-1]:
        return []
    inner = indent if returns else indent + "    "
    text = "\n".join(reindent(subscripted(parsed, function, [local.node]), len(indentation(parsed.data,
                                                                                         local.node.start_byte)), inner)
                     for local in moved)
    edits = [(*(own_lines(parsed, local.node) or (local.node.start_byte, local.node.end_byte)), "")
             for local in moved]
    if returns:
        return edits + [(guard.end_byte, guard.end_byte, "\n" + text)]
    if consequence.type == "compound_statement":
        return edits + [(consequence.start_byte + 1, consequence.start_byte + 1, "\n" + text)]
    work = reindent(parsed.text(consequence), len(indentation(parsed.data, consequence.start_byte)), inner)
    return edits + [(consequence.start_byte, consequence.end_byte, f"{{\n{text}\n{work}\n{indent}}}")]


def if_form(state: KernelState) -> KernelState:
    """`state` with each elementwise kernel in the `return` form (`if (i >= n) return;` and the element's work
    after it) rewritten to the `if` form (`if (i < n) { the work }`), which computes the same: the work is the
    rest of the kernel. The same state when no kernel is in the `return` form."""
    parsed = cp.parse(state.source)
    edits = []
    for _, work in readable(parsed, lambda f: element_work(state, parsed, f)):
        if work.nodes[0].parent != work.guard:  # the `return` form: the work follows the guard
            edits.append((work.guard.start_byte, work.end, f"if ({work.index} < {work.bound}) {work.work}"))
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _simple(bound: Node) -> bool:
    if bound.type == "binary_expression":
        return operator(bound) in ("*", "+", "-", "/", "%") and all(
            _simple(bound.child_by_field_name(side)) for side in ("left", "right"))
    return bound.type in _BOUND_TYPES


def grid_index(parsed: cp.ParsedSource, node: Node, wide: bool = False) -> tuple[str, str]:
    """(axis, name) of `int name = blockIdx.a * blockDim.a + threadIdx.a;` (canonical, `_canonical`), and with
    `wide` of its 64-bit form `long long name = (long long)blockIdx.a * ...;` too, else ("", "")."""
    widened = r"long long ([A-Za-z_]\w*) = \(long long\)" if wide else r"(?!)([A-Za-z_]\w*)"  # group 2 either way
    match = re.fullmatch(rf"(?:int ([A-Za-z_]\w*) = |{widened})blockIdx\.([xyz]) \* blockDim\.\3 \+ threadIdx\.\3;",
                         squash(parsed.text(node)))
    return (match[3], match[1] or match[2]) if match else ("", "")


def bounds_2d(condition: str, row: str, column: str, relation: str = "<", joined: str = "&&") -> tuple[str, str] | None:
    """(M, N) of `r < M && c < N` (relation `<`, joined `&&`; either order), or of `r >= M || c >= N`; else None."""
    for first, second in ((row, column), (column, row)):
        match = re.fullmatch(rf"{first} {relation} ([A-Za-z_]\w*) {re.escape(joined)} {second} {relation} "
                             rf"([A-Za-z_]\w*)", condition)
        if match:
            return (match[1], match[2]) if first == row else (match[2], match[1])
    return None
