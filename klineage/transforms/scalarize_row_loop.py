"""scalarize_row_loop: a warp's strided loop over a row, taken 16 bytes a lane at a time, goes back to one column
a lane per 32.

The mechanism (forward): a warp-per-row loop `for (int j = lane; j < n; j += 32) S` (`lane` declared as
`threadIdx.x % 32` or `threadIdx.x & 31`) that reads its row in this one pass gives each lane four consecutive
columns per step, `for (int row_j4 = 4 * lane; row_j4 < n; row_j4 += 128)`: every float array S reads at `[j]` or
`[X + j]` is one `float4` load per step (through `__ldg` where S read it so or the kernel cannot write it), S runs
once per column on registers (`j = row_j4 + row_k`), and every float array S writes at `[X + j]` is one `float4`
store per step (`_row_vectors.py`). That walk is taken where it is exact, checked right before the loop: n divisible
by 4, every vectorized pointer 16-byte aligned, every offset X without n as a factor a multiple of 4; otherwise the
loop runs as it was, kept verbatim in the `else` branch. Each lane still meets its columns in increasing order, so
a reduction that breaks ties by column stays exact; sums run in another order.

Backward puts each vectorized loop back from its `else` branch.

Legality (forward_sites), conservative: S touches arrays with j only at `[j]` or `[X + j]`, X free of j; they are
float pointers; S assigns neither them, nor the names of X, nor j or n, and declares none of them; an array S writes
it writes once, by `=`, in a statement no condition or loop encloses within S, and never reads; S has no barrier,
shuffle, atomic, `return`, `break`, `continue` or `goto`; the kernel names none of the `row_` names the forward
declares; the launch passes no buffer twice. A row the kernel reads in two or more such loops is left to
`uncache_row` (keeping it in registers saves every pass but the first): a loop reading it is no site.

Anchor: the kernel, kind "function", key "row_loop"; the forward takes every site of the kernel at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import _row_vectors as rv
from klineage.transforms import register
from klineage.transforms._edit import Edit, indentation, reindent, splice
from klineage.transforms._naive import kernel, launches_of, squash
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

KEY = "row_loop"
_OWN_NAMES = re.compile(r"\brow_(?:j4|k|r\d+|v\d+)\b")
_STRIDED = re.compile(r"^for \(int (\w+) = (?:([0-3]) \+ )?(\w+); \1 < (\w+); \1 \+= 32\)$")
_VECTOR = re.compile(r"^for \(int row_j4 = (?:4 \+ )?4 \* (\w+); row_j4 < (\w+); row_j4 \+= 128\)$")


@dataclass(frozen=True)
class Loop:
    node: Node
    start: int  # the first column, 0 to 3: C of `j = C + lane`
    lane: str
    bound: str
    step: rv.Pass


class ScalarizeRowLoop(Transform):
    name = "scalarize_row_loop"
    intent = ("Walk a row a warp reads once four consecutive columns a lane at a time, with float4 loads and stores "
              "of every row array, where the row length divides by 4 and the pointers are 16-byte aligned, the "
              "strided loop as it was otherwise.")
    removes = ("vector_type_float4",)
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])
                for function in cp.functions(parsed) if function.is_kernel and _vectorized(parsed, function)]

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function in cp.functions(parsed):
            if function.is_kernel and _loops(state, parsed, function, quiet=True):
                anchors.append(Anchor(function.name, "function", KEY, parsed.text(function.node)[:200]))
        return anchors

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        loops = _loops(state, parsed, function, quiet=False)
        constant = rv.read_only(parsed, function)
        edits = [Edit(loop.node.start_byte, loop.node.end_byte, _vector_loop(parsed, loop, constant)) for loop in loops]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        moved = ", ".join(rv.pointers(loop.step for loop in loops))
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"width": rv.WIDTH},
                            note=f"{function.name}: {len(loops)} strided loop(s) four columns a lane at a time, float4 "
                                 f"({moved}), where the row divides by {rv.WIDTH} and the pointers are aligned")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        edits = []
        for node, kept in _vectorized(parsed, function):
            indent = indentation(parsed.data, node.start_byte)
            text = reindent(parsed.text(kept), len(indent) + len(rv.UNIT), indent)
            edits.append(Edit(node.start_byte, node.end_byte, text[len(indent):]))
        if not edits:
            raise NotApplicable(f"{anchor}: no strided loop walks its row 16 bytes a lane at a time")
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: the strided loop(s) one column a lane per 32 again")


def _vectorized(parsed: cp.ParsedSource, function: cp.Function) -> list[tuple[Node, Node]]:
    """(the `if`, the strided loop kept in its `else`) of every loop the forward vectorized."""
    found = []
    for node in cp.nodes_of_type(function.node, "if_statement"):
        consequence, alternative = node.child_by_field_name("consequence"), node.child_by_field_name("alternative")
        loops = [c for c in consequence.named_children if c.type == "for_statement"][-1:] \
            if consequence is not None and consequence.type == "compound_statement" else []
        kept = [c for c in alternative.named_children if c.type == "compound_statement"] if alternative else []
        kept = [c for c in kept[0].named_children if c.type == "for_statement"] if len(kept) == 1 else []
        if len(loops) == 1 and _VECTOR.match(_header(parsed, loops[0])) and len(kept) == 1 \
                and _STRIDED.match(_header(parsed, kept[0])):
            found.append((node, kept[0]))
    return found


def _header(parsed: cp.ParsedSource, loop: Node) -> str:
    return squash(parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte].decode())


def _lanes(parsed: cp.ParsedSource, function: cp.Function) -> set[str]:
    text = parsed.text(function.node)
    return set(re.findall(r"\bint\s+(\w+)\s*=\s*\(?threadIdx\.x\s*(?:%\s*32|&\s*31)\)?\s*;", text))


def _loops(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, *, quiet: bool) -> list[Loop]:
    """Every strided loop of the kernel the forward may vectorize (quiet: [] where the kernel cannot have one;
    else NotApplicable with the reason of the first loop refused, when none is a site)."""
    reasons = []
    try:
        if _OWN_NAMES.search(parsed.text(function.node)):
            raise NotApplicable(f"{function.name} already names one of the row_ names the forward declares")
        launches_of(state, function.name, dimensions=3)  # distinct buffers: a stored vector reaches no read row
    except NotApplicable:
        if quiet:
            return []
        raise
    lanes, floats = _lanes(parsed, function), rv.float_pointers(parsed, function)
    strided = [node for node in cp.nodes_of_type(function.node, "for_statement")
               if (match := _STRIDED.match(_header(parsed, node))) and match[3] in lanes]
    reads = {}  # array -> the strided loops reading it at their column: more than one, and the cache owns it
    for node in strided:
        column = _STRIDED.match(_header(parsed, node))[1]
        for array in set(re.findall(rf"\b(\w+)\s*\[[^\]]*\b{column}\b", parsed.text(node.child_by_field_name("body")))):
            reads.setdefault(array, set()).add(node.id)
    found = []
    for node in strided:
        try:
            found.append(_loop(parsed, node, floats, reads))
        except NotApplicable as refused:
            reasons.append(str(refused))
    if not found and not quiet:
        raise NotApplicable(reasons[0] if reasons else f"{function.name} has no strided warp loop over a row")
    return found


def _loop(parsed: cp.ParsedSource, node: Node, floats: set[str], reads: dict[str, set[int]]) -> Loop:
    column, start, lane, bound = _STRIDED.match(_header(parsed, node)).groups()
    body = node.child_by_field_name("body")
    step = rv.read_pass(parsed, body, column, cached=None)
    text = parsed.text(body)
    for access in step.accesses:
        if access.array not in floats:
            raise NotApplicable(f"{access.array} is no float pointer")
        if len(reads.get(access.array, ())) > 1 and not access.written:
            raise NotApplicable(f"{access.array} is read in more than one strided loop: the register cache's")
        for name in sorted(access.names | {bound}):
            if re.search(rf"\b{name}\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+\s*{name}\b|\b{name}\s*\+\+|--\s*{name}\b|"
                         rf"\b{name}\s*--", text):
                raise NotApplicable(f"the loop assigns {name}")
            if any(name in squash(parsed.text(d)).split("=")[0].split() for d in cp.nodes_of_type(body, "declaration")):
                raise NotApplicable(f"the loop declares {name}")
    if not step.accesses:
        raise NotApplicable("the loop touches no row array at its column")
    return Loop(node, int(start or 0), lane, bound, step)


def _vector_loop(parsed: cp.ParsedSource, loop: Loop, constant: frozenset[str]) -> str:
    """`if (exact) { the loop, four columns a lane per step } else { the loop as it was }`."""
    indent, unit = indentation(parsed.data, loop.node.start_byte), rv.UNIT
    step = rv.vector_step(parsed, loop.step, constant, "row_", indent + unit * 2,
                          ((loop.step.column, "row_j4 + row_k"),))
    original = reindent(parsed.text(loop.node), len(indent), indent + unit)
    first = f"{rv.WIDTH} + " if loop.start else ""
    # a start of 1 to 3: those first columns one a lane, the loop's own body verbatim, then whole vectors from 4
    column, inner = loop.step.column, indent + unit
    body = reindent(parsed.text(loop.node.child_by_field_name("body")), len(indent), inner)[len(inner):]
    peeled = (f"{inner}for (int {column} = {loop.start} + {loop.lane}; {column} < {rv.WIDTH} && {column} < "
              f"{loop.bound}; {column} += 32) {body}") if loop.start else ""
    lines = [f"{indent}if ({' && '.join(rv.checks(loop.bound, [loop.step]))}) {{",
             *([peeled] if peeled else []),
             f"{indent}{unit}for (int row_j4 = {first}{rv.WIDTH} * {loop.lane}; row_j4 < {loop.bound}; "
             f"row_j4 += {32 * rv.WIDTH}) {{",
             step, f"{indent}{unit}}}", f"{indent}}} else {{", original, f"{indent}}}"]
    return "\n".join(lines)[len(indent):]


register(ScalarizeRowLoop())
