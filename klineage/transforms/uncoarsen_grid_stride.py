"""uncoarsen_grid_stride: a grid-stride loop over elements, on a grid shrunk by a factor, becomes one element per
thread; forward finds its sites by analysis.

The mechanism (forward): an elementwise kernel, one thread per element, in either naive form

    int i = blockIdx.x * blockDim.x + threadIdx.x;          long long i = (long long)blockIdx.x * blockDim.x + ...;
    if (i < n) <body>                                       if (i >= n) return;
                                                            <rest of the kernel>

becomes a grid-stride loop, `for (int i = <same>; i < n; i += gridDim.x * blockDim.x) <body>`, and every launch of
the kernel gets a grid of cdiv(grid, factor) blocks: each thread handles about `factor` elements, a whole grid's
width apart, so that a warp's accesses stay coalesced and the loop condition is the guard of the tail. The loop
covers every element for any grid size, so the factor is a pure tuning value (the carrier `factor`, 4 unless a
card names others: this transform's cards as `factor`, uncoarsen's as `old`).

Scalar locals declared between the index and the guard (`int cols = ca + cb;`: `_naive.scalar_locals`) stay before
the loop, computed once; one that names the index (`int r = i / cols;`) moves into the work first (`_naive.sunk`),
computed every iteration.

Legality (forward_sites), decided on the parse and the plan: the kernel is launched one-dimensionally, passing
no buffer twice; the element index is declared (not `const`) before its guard, only such locals between, the
kernel assigns no name of the bound (the loop's condition reads it every iteration), and the guard ends the
kernel (the `if (i < n)` form) or everything after it is the element's work (the `return` form); the element's
work has no loop (a kernel that walks a row per thread is no elementwise kernel), no barrier, warp collective,
shared memory, `asm`, `return`, `break` or `goto`, names no thread or block coordinate (its meaning would change
with the element), and never assigns the index; the kernel names `gridDim` nowhere. Elements are independent:
the threads of the naive kernel run in no order, and the loop is one such order. Known limit: an `int` index
steps past INT_MAX (and wraps) when n is within a grid's width of 2^31; the naive `int` kernel already fails
at 2^31 elements.

Backward writes the `if (i < n)` form from the loop, its grid multiplied back (the plan's `cdiv(grid, factor)`
unwrapped); a kernel that came from the `return` form gets the `if` form, which computes the same.

Anchor: the kernel, kind "function", key `<index>*<factor>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import indentation, splice
from klineage.transforms._flatten import Shape, flattened
from klineage.transforms._naive import (
    INDEXES,
    between,
    element_work,
    kernel,
    launches_of,
    readable,
    rescaled_grid,
    squash,
    statements,
    sunk,
    unwrapped,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

FACTOR = 4
STRIDE = "gridDim.x * blockDim.x"
_KEY = re.compile(r"^(?P<index>[A-Za-z_]\w*)\*(?P<factor>[1-9]\d*)$")


class UncoarsenGridStride(Transform):
    name = "uncoarsen_grid_stride"
    intent = ("Give each thread several elements of an elementwise kernel in a grid-stride loop and launch "
              "proportionally fewer blocks; the loop condition guards the tail.")
    placement = Placement.ANALYSIS
    kin = ("uncoarsen",)  # its cards coarsen threads through a constant; this places coarsening afresh

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        found = []
        for function in cp.functions(parsed):
            try:
                loop, index, _ = _loop(parsed, function)
                factor = _factor(state, function.name)
            except NotApplicable:
                continue
            found.append(Anchor(function.name, "function", f"{index}*{factor}", parsed.text(loop)[:200]))
        return found

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        state = sunk(flattened(canonical(state), frozenset({Shape.MATRIX})))  # the naive index, on one axis
        parsed = cp.parse(state.source)
        # this transform's own cards name `factor`; uncoarsen's (kin) name the factor they took away `old`
        factors = self.carrier_counts(carrier, "factor", "old", above=1) or [FACTOR]
        return [Anchor(function.name, "function", f"{site.index}*{factor}",
                       parsed.data[site.start:site.end].decode("utf-8")[:200])
                for function, site in readable(parsed, lambda f: element_work(state, parsed, f)) for factor in factors]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        index, factor = _key(anchor)
        state = sunk(flattened(canonical(state), frozenset({Shape.MATRIX})))  # the naive index, on one axis
        parsed = cp.parse(state.source)
        site = element_work(state, parsed, kernel(parsed, anchor))
        if site.index != index:
            raise NotApplicable(f"{anchor}: the element index is '{site.index}'")
        loop = f"for ({site.kind} {index} = {site.init}; {index} < {site.bound}; {index} += {STRIDE}) {site.work}"
        # the locals between the index and the guard stay before the loop: none names the index (`sunk` moved those)
        ahead = between(site.locals)
        kept = parsed.data[ahead[0].node.start_byte:site.guard.start_byte].decode("utf-8") if ahead else ""
        source = splice(parsed.data, [(site.start, site.end, kept + loop)])[0].decode("utf-8")
        plan = rescaled_grid(state, site.function.name, lambda grid: f"cdiv({grid}, {factor})")
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan, carrier={"factor": factor},
                            note=f"{site.function.name}: a grid-stride loop over {index}, about {factor} elements "
                                 f"per thread; grid / {factor}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        index, factor = _key(anchor)
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        loop, found, (kind, init, bound) = _loop(parsed, function)
        if found != index or _factor(state, function.name) != factor:
            raise NotApplicable(f"{anchor}: the loop is over '{found}' on a grid / {_factor(state, function.name)}")
        indent = indentation(parsed.data, loop.start_byte)
        body = parsed.text(loop.child_by_field_name("body"))
        text = f"{kind} {index} = {init};\n{indent}if ({index} < {bound}) {body}"
        source = splice(parsed.data, [(loop.start_byte, loop.end_byte, text)])[0].decode("utf-8")
        plan = rescaled_grid(state, function.name, lambda grid: unwrapped(grid, "cdiv(", f", {factor})"))
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            note=f"{function.name}: one element per thread, grid * {factor}")


def _key(anchor: Anchor) -> tuple[str, int]:
    match = _KEY.match(anchor.key)
    if anchor.kind != "function" or match is None:
        raise NotApplicable(f"uncoarsen_grid_stride needs a function anchor keyed `<index>*<factor>`, not {anchor}")
    return match["index"], int(match["factor"])


def _factor(state: KernelState, entry: str) -> int:
    """The factor every launch of `entry` divides its grid by (`cdiv(grid, k)`)."""
    factors = {re.fullmatch(r"cdiv\((.+), ([1-9]\d*)\)", str(launch.grid[0]).strip())
               for launch in launches_of(state, entry, dimensions=1)}
    values = {int(f[2]) for f in factors if f is not None}
    if None in factors or len(values) != 1:
        raise NotApplicable(f"the launches of {entry} do not all divide their grid by one factor")
    return values.pop()


def _loop(parsed: cp.ParsedSource, function: cp.Function) -> tuple[Node, str, tuple[str, str, str]]:
    """(the loop, its index, (index type, initializer, bound)) of a kernel in the form forward writes."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    for statement in statements(body):
        if statement.type != "for_statement":
            continue
        header = re.fullmatch(r"for \((int|long long) ([A-Za-z_]\w*) = (.+?); \2 < (.+?); \2 \+= "
                              + re.escape(STRIDE) + r"\)", squash(parsed.text(statement)[:statement.child_by_field_name(
                                  "body").start_byte - statement.start_byte]))
        if header is not None and dict(INDEXES).get(header[1]) == header[3]:
            return statement, header[2], (header[1], header[3], header[4])
    raise NotApplicable(f"{function.name} has no grid-stride loop over its elements")


register(UncoarsenGridStride())
