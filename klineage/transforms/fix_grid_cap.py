"""fix_grid_cap: a grid-stride kernel's grid, sized to the GPU, becomes a fixed number of blocks; forward finds its
sites by analysis.

The mechanism (forward): a grid-stride kernel launched on a fixed number of blocks (`grid = [256]`, or a cap on
the work's blocks, `min(cdiv(n, 256), 256)`) gets a grid of `num_sms * K` blocks in place of that number, K blocks
per streaming multiprocessor: with a fixed 256 blocks an H100's 132 SMs hold about two blocks each, too few warps
to keep enough loads in flight to cover memory latency, and more SMs would hold even fewer. K is the carrier
`blocks_per_sm`: a card's values, else as many blocks as an SM's 2048 threads hold (sm_70 to sm_90; at most 32).
More blocks than an SM can hold at once only queue: the loop still covers every element.

Backward, the walk's simplification, puts the fixed number back: `num_sms * K` (K a number or a source constant,
in the grid alone or as one side of its `min`) becomes the carrier `cap`, 256 unless the anchor names another.

Legality, decided on the parse and the plan: every launch of the kernel is one-dimensional and has the same grid
form, and the kernel computes the same on any number of blocks (`_grid_free`: the grid is read only as the start
and step of grid-stride loops, and nothing outside them stores once per block). The launch plan evaluates
`num_sms` from the GPU the gate runs on.

Anchor: the kernel, kind "plan", key `<K>@<cap>` (K as the sized grid writes it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms import register
from klineage.transforms._c_style import c_style
from klineage.transforms._grid_free import SMS, block_names, blocks_per_sm, check_grid_free
from klineage.transforms._naive import kernel, launches_of, readable, rescaled_grid
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

CAP = 256  # the fixed grid people reach for first
_KEY = re.compile(r"^(?P<per_sm>[A-Za-z_]\w*|[1-9]\d*)@(?P<cap>[1-9]\d*)$")


def _spans(grid: str) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, str]]]:
    """(fixed, sized) places of a grid expression: each fixed number (the whole grid, or one side of a two-argument
    `min`) as (start, end, value), each `num_sms * K` there as (start, end, K as written)."""
    try:
        tree = expr.parse(grid)
    except ExpressionError:
        return [], []
    places = [tree.body] + [a for node in ast.walk(tree) if isinstance(node, ast.Call) and
                            isinstance(node.func, ast.Name) and node.func.id == "min" and len(node.args) == 2
                            for a in node.args]
    fixed, sized = [], []
    for node in places:
        span = (node.col_offset, node.end_col_offset)
        if (count := _count(node)) is not None and count.isdigit():
            fixed.append((*span, int(count)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            pair = ((node.left, node.right), (node.right, node.left))
            terms = [_count(k) for sms, k in pair if isinstance(sms, ast.Name) and sms.id == SMS]
            if len(terms) == 1 and terms[0] is not None:
                sized.append((*span, terms[0]))
    return fixed, sized


def _count(node: ast.expr) -> str | None:
    """A positive whole number or a name, as written; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value > 0:
        return str(node.value)
    return node.id if isinstance(node, ast.Name) and node.id != SMS else None


def _grid(state: KernelState, entry: str) -> str:
    """The grid every launch of `entry` has: one form, on one-dimensional launches."""
    grids = {str(launch.grid[0]).strip() for launch in launches_of(state, entry, dimensions=1)}
    if len(grids) != 1:
        raise NotApplicable(f"the launches of {entry} have different grids")
    return grids.pop()


def _site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, *, sized: bool) -> tuple[str, Any]:
    """(the kernel's grid, its one fixed number or its one `num_sms * K`) where its grid can be resized (see the
    module's docstring), else NotApplicable with the reason."""
    grid = _grid(state, function.name)
    fixed, by_sms = _spans(grid)
    if sized and len(by_sms) != 1:
        raise NotApplicable(f"{function.name}'s grid {grid} is not sized as {SMS} * K")
    if not sized and (len(fixed) != 1 or by_sms):
        raise NotApplicable(f"{function.name}'s grid {grid} fixes no number of blocks")
    check_grid_free(parsed, function, block_names(state, function.name))
    return grid, (by_sms if sized else fixed)[0]


class FixGridCap(Transform):
    name = "fix_grid_cap"
    intent = ("Launch a grid-stride kernel on blocks in proportion to the GPU's SMs, not a fixed count, so that "
              "every SM holds enough warps to keep memory busy.")
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "plan", f"{per_sm}@{CAP}", grid)
                for function, (grid, (_, _, per_sm)) in readable(parsed, lambda f: _site(state, parsed, f, sized=True))]

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        read = c_style(state)  # C's loops as the forwards read them; only the plan changes
        parsed = cp.parse(read.source)
        named = self.carrier_counts(carrier, "blocks_per_sm")
        return [Anchor(function.name, "plan", f"{k}@{cap}", grid)
                for function, (grid, (_, _, cap)) in readable(parsed, lambda f: _site(read, parsed, f, sized=False))
                for k in (named or [blocks_per_sm(state, function.name)])]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        return self._resized(state, anchor, Direction.FORWARD)

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        return self._resized(state, anchor, Direction.BACKWARD)

    def _resized(self, state: KernelState, anchor: Anchor, direction: Direction) -> Rewrite:
        """Forward: the fixed number of blocks the anchor names becomes num_sms * K; backward: the reverse."""
        per_sm, cap = _key(anchor)
        forward = direction is Direction.FORWARD
        read = c_style(state) if forward else state  # the source stays as written: only the plan changes
        parsed = cp.parse(read.source)
        function = kernel(parsed, anchor)
        grid, (start, end, found) = _site(read, parsed, function, sized=not forward)
        old, new = (str(cap), f"{SMS} * {per_sm}") if forward else (f"{SMS} * {per_sm}", str(cap))
        if str(found) != (str(cap) if forward else per_sm):
            raise NotApplicable(f"{anchor}: the grid {grid} does not launch {old} blocks")
        plan = rescaled_grid(state, function.name, lambda _: f"{grid[:start]}{new}{grid[end:]}")
        return self.rewrite(state, anchor, direction, state.source, plan=plan, carrier=_carrier(state, per_sm, cap),
                            note=f"{function.name}: {new} blocks in place of {old}")


def _key(anchor: Anchor) -> tuple[str, int]:
    match = _KEY.match(anchor.key)
    if anchor.kind != "plan" or match is None:
        raise NotApplicable(f"fix_grid_cap needs a plan anchor keyed `<blocks per SM>@<cap>`, not {anchor}")
    return match["per_sm"], int(match["cap"])


def _carrier(state: KernelState, per_sm: str, cap: int) -> dict[str, Any]:
    """The tuning values: blocks per SM as a number where the source's constants say it, and the fixed cap."""
    try:
        value: Any = expr.evaluate_int(per_sm, parse_constants(state.source))
    except ExpressionError:
        value = per_sm
    return {"blocks_per_sm": value, "cap": cap}


register(FixGridCap())
