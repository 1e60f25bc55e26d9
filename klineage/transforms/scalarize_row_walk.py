"""scalarize_row_walk: a warp's walk over a row, 16 bytes a lane per step, goes back to one float a lane per 32
columns.

The mechanism (forward): a reduction a warp runs over a row with its lanes striding the columns (`for (int j = lane;
j < n; j += 32)`, or from `S + lane` with S a constant, as `serialize_reduction` and the shuffle cards write it)
takes four consecutive columns a lane per step instead: `w_j4 = 4 * lane`, stepping by 128. Every row array the walk
reads at `[j]` or `[X + j]` is loaded once per step as a `float4` (through the read-only cache where the walk read
it so, or the kernel cannot write it), and the loop's statements run once per column on registers (`j = w_j4 + w_k`,
columns before S skipped). That is exact only where the row length divides by 4, every vectorized pointer is 16-byte
aligned and every offset X is a multiple of 4 (one with the row length as a factor is): checked at run time in front
of the walk, the scalar walk kept verbatim after `else` for the rest.

Which lane takes a column changes, so only a walk whose result cannot tell is a site: its body is a fold of the
columns (`_warp_reduction.fold`: sums, `f(acc, e)` combines, kept extremes, an arg reduction; no running sum, no
store), and each value it folds into is combined across the full warp by a butterfly right after the walk, the
first thing that reads it. Each lane still takes its columns in increasing order, so an arg reduction's merge
(the smaller column on ties) keeps the first best column.

Backward puts the scalar walk, kept after `else`, back in place of the whole `if`.

A butterfly in people's spelling (another name for the offset, `o >>= 1`, the mask `0xffffffff`, a butterfly down
whose sum only lane 0 reads, ...) is read as the forwards write it first (`_butterflies`).

Legality (forward_sites), conservative: the lane is an `int` the kernel sets to `threadIdx.x % 32` (or `& 31`)
and never assigns, in blocks of whole warps; the walk's index is an `int` that its body never assigns; every array
the body subscripts with it is a float pointer read at `[j]` or `[X + j]`, X free of `j`, none written; the body has
no barrier, shuffle, atomic, `return`, `break`, `continue` or `goto`; the kernel names none of the names the forward
declares (`w_...`).

Anchor: the kernel, kind "loop", key `walk:<index>#<n>`, the walk's ordinal among the kernel's lane walks.
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
from klineage.transforms._arg_reduction import is_pair_butterfly
from klineage.transforms._butterflies import butterflies_read
from klineage.transforms._edit import indentation, is_written, reindent, splice
from klineage.transforms._naive import kernel, readable, squash
from klineage.transforms._warp_reduction import ROWS, WARP, check_launch, fold
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

PREFIX = "w_"
_OWN_NAMES = re.compile(rf"\b{PREFIX}\w+")
_LANE = re.compile(r"^(?:const )?int (\w+) = \(?threadIdx\.x (?:% 32|& 31)\)?;$")  # never assigned: `_walk`
# from the lane, or a constant count of columns past it (the same in every lane: the walk still covers each column)
_WALK = re.compile(rf"^for \(int (\w+) = (?:(\d+) \+ )?(\w+); \1 < ([\w.]+); \1 \+= {WARP}\)$")
_VECTOR_HEAD = re.compile(rf"^for \(int {PREFIX}j4 = 4 \* \w+; {PREFIX}j4 < [\w.]+; {PREFIX}j4 \+= {4 * WARP}\)$")


@dataclass(frozen=True)
class Walk:
    node: Node  # the `for` statement
    index: str
    start: str  # S of `S + lane`, "" from the lane itself
    lane: str
    bound: str
    step: rv.Pass


class ScalarizeRowWalk(Transform):
    name = "scalarize_row_walk"
    intent = ("Give each lane of a warp four consecutive columns per step of its walk over a row, loading every row "
              "array as a float4, where the row length divides by 4 and the pointers are 16-byte aligned; the "
              "scalar walk otherwise.")
    removes = ("vector_type_float4",)
    placement = Placement.ANALYSIS
    # Not proposed by the 16-byte vector (devectorize) cards: taken first in their path it leaves uncache_row no
    # site, and the register row cache those cards fill next measured 10-12.6x on the transfer's row operators
    # (H200), while this walk measured 1.065x and 0.971x (H100). The catalog offers it, weighed as a rival.
    lent = False

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [_anchor(parsed, function, number, walk)
                for function in cp.functions(parsed) if function.is_kernel
                for number, walk in enumerate(_vector_walks(parsed, function))]

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        state = butterflies_read(state)
        parsed = cp.parse(state.source)
        return [_anchor(parsed, function, number, walk) for function, walks in readable(parsed, lambda f: _walks(
            state, parsed, f)) for number, walk in enumerate(walks)]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = butterflies_read(state)  # as forward_sites reads it
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        walk = _chosen(_walks(state, parsed, function), anchor, lambda w: w.index)
        indent = indentation(parsed.data, walk.node.start_byte)
        inner = indent + rv.UNIT
        step = rv.vector_step(parsed, walk.step, rv.read_only(parsed, function), PREFIX, inner + rv.UNIT,
                              ((walk.index, f"{PREFIX}j4 + {PREFIX}k"),))
        if walk.start:  # the columns before the walk's first are not its own: skipped
            head = f"for (int {PREFIX}k = 0; {PREFIX}k < {rv.WIDTH}; ++{PREFIX}k) {{"
            step = step.replace(head, f"{head}\n{inner + rv.UNIT * 2}if ({PREFIX}j4 + {PREFIX}k < {walk.start}) "
                                      "continue;", 1)
        scalar = reindent(parsed.text(walk.node), len(indent), inner)
        text = "\n".join([f"if ({' && '.join(rv.checks(walk.bound, [walk.step]))}) {{",
                          f"{inner}for (int {PREFIX}j4 = 4 * {walk.lane}; {PREFIX}j4 < {walk.bound}; "
                          f"{PREFIX}j4 += {4 * WARP}) {{", step, f"{inner}}}", f"{indent}}} else {{",
                          scalar.rstrip("\n"), f"{indent}}}"])
        source = splice(parsed.data, [(walk.node.start_byte, walk.node.end_byte, text)])[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"width": rv.WIDTH},
                            note=f"{function.name}: the walk over {walk.index} takes 4 columns a lane per step as "
                                 f"float4 ({', '.join(rv.pointers([walk.step]))}) when {walk.bound} % {rv.WIDTH} == 0 "
                                 f"and the pointers are 16-byte aligned")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        node = _chosen(_vector_walks(parsed, function), anchor, lambda n: _scalar(n)[1])
        scalar, _ = _scalar(node)
        indent = indentation(parsed.data, node.start_byte)
        text = reindent(parsed.text(scalar), len(indentation(parsed.data, scalar.start_byte)), indent).strip()
        source = splice(parsed.data, [(node.start_byte, node.end_byte, text)])[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: the walk takes one float a lane per {WARP} columns again")


def _anchor(parsed: cp.ParsedSource, function: cp.Function, number: int, walk: Walk | Node) -> Anchor:
    node = walk.node if isinstance(walk, Walk) else walk
    index = walk.index if isinstance(walk, Walk) else _scalar(walk)[1]
    return Anchor(function.name, "loop", f"walk:{index}#{number}", parsed.text(node)[:200])


def _chosen(found: list, anchor: Anchor, index_of) -> Any:
    for number, item in enumerate(found):
        if anchor.key == f"walk:{index_of(item)}#{number}":
            return item
    raise NotApplicable(f"{anchor}: no such walk")


def _walks(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> list[Walk]:
    """The kernel's lane walks that are sites; NotApplicable where it has none (with the first reason)."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is no kernel")
    if body is None or _OWN_NAMES.search(parsed.text(function.node)):
        raise NotApplicable(f"{function.name} names {PREFIX}... already" if body is not None else "no body")
    lanes = {m[1] for d in cp.nodes_of_type(body, "declaration") if (m := _LANE.match(squash(parsed.text(d))))}
    found, reasons = [], []
    for node in cp.nodes_of_type(body, "for_statement"):
        loop_body = node.child_by_field_name("body")
        match = _WALK.match(squash(parsed.data[node.start_byte:loop_body.start_byte].decode()))
        if match is None or match[3] not in lanes:
            continue
        try:
            found.append(_walk(parsed, function, node, match))
        except NotApplicable as refused:
            reasons.append(str(refused))
    if not found:
        raise NotApplicable(reasons[0] if reasons else f"{function.name} has no walk of a lane over a row")
    check_launch(state, function.name)  # a lane is `threadIdx.x % 32` of a whole warp only in blocks of whole warps
    return found


def _walk(parsed: cp.ParsedSource, function: cp.Function, node: Node, match: re.Match) -> Walk:
    index, start, lane, bound = match[1], match[2] or "", match[3], match[4]
    if any(is_written(n) for n in cp.nodes_of_type(function.node, "identifier") if parsed.text(n) == lane):
        raise NotApplicable(f"the lane {lane} is assigned")
    loop = fold(parsed, node, index, start or "0", "int")
    if loop.scan is not None:
        raise NotApplicable("a running sum: each column's value depends on the lane's earlier columns")
    step = rv.read_pass(parsed, node.child_by_field_name("body"), index, ("", ""))
    floats = rv.float_pointers(parsed, function)
    for access in step.accesses:
        if access.written or access.array not in floats:
            raise NotApplicable(f"{access.array} is {'written' if access.written else 'no float array'} in the walk")
    if not step.accesses:
        raise NotApplicable("the walk reads no row array")
    combined = _butterfly_after(parsed, node)
    missing = [acc.name for acc in loop.accumulators if acc.name not in combined]
    if missing:
        raise NotApplicable(f"{', '.join(missing)} not combined across the warp right after the walk")
    return Walk(node, index, start, lane, bound, step)


def _butterfly_after(parsed: cp.ParsedSource, node: Node) -> set[str]:
    """The names the butterflies right after `node` exchange across the full warp (one loop a value, or the pair
    loop of an arg reduction, as the warp reductions write them): none without one."""
    names: set[str] = set()
    after = node.next_named_sibling
    while after is not None and after.type in ("for_statement", "comment"):
        text = parsed.text(after)
        if after.type == "for_statement":
            if not (ROWS.is_butterfly(squash(text)) or is_pair_butterfly(text, ROWS.butterfly, ROWS.mask)):
                break
            names |= set(re.findall(rf"__shfl_xor_sync\({re.escape(ROWS.mask)}, (\w+), offset\)", squash(text)))
        after = after.next_named_sibling
    return names


def _vector_walks(parsed: cp.ParsedSource, function: cp.Function) -> list[Node]:
    """The `if (...) { <vector walk> } else <scalar walk>` statements the forward writes."""
    body = function.node.child_by_field_name("body")
    found = []
    for node in cp.nodes_of_type(body, "if_statement") if body is not None else ():
        consequence = node.child_by_field_name("consequence")
        first = consequence.named_children[0] if consequence is not None and consequence.named_children else None
        if first is not None and first.type == "for_statement" and _VECTOR_HEAD.match(squash(
                parsed.data[first.start_byte:first.child_by_field_name("body").start_byte].decode())):
            try:
                _scalar(node)
            except NotApplicable:
                continue
            found.append(node)
    return found


def _scalar(node: Node) -> tuple[Node, str]:
    """The scalar walk an `if` the forward wrote keeps after `else`, and its index."""
    alternative = node.child_by_field_name("alternative")
    block = alternative.named_children[-1] if alternative is not None and alternative.named_children else None
    walk = block.named_children[0] if block is not None and block.type == "compound_statement" and \
        len(block.named_children) == 1 else None
    if walk is None or walk.type != "for_statement":
        raise NotApplicable("no scalar walk after else")
    declarator = walk.child_by_field_name("initializer")
    name = declarator.child_by_field_name("declarator") if declarator is not None else None
    name = name.child_by_field_name("declarator") if name is not None and name.type == "init_declarator" else name
    return walk, name.text.decode() if name is not None else ""


register(ScalarizeRowWalk())
