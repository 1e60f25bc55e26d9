"""A product whose row is a layer of the grid, read as the 2-D form of one thread per output that `untile_matmul`
reads. People launch a row of blocks per output row (grid (cdiv(N, 256), M), block 256) and write

    int c = blockIdx.x * blockDim.x + threadIdx.x;        int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y;                             ->    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (c >= N) return;                                   if (r >= M || c >= N) return;

(either declaration first; the guard may wrap the work instead: `if (c < N) { ... }` becomes `if (r < M && c < N)`).
Where every launch of the kernel has a 1-D block and a 2-D grid of M layers along y (M the value it passes for a
scalar parameter; where it passes none, the kernel is given one, `int grid_y`, as `_flatten` gives it), blockDim.y
is 1 and threadIdx.y 0, so r is blockIdx.y as before, and below M in every block: the
bound added holds wherever the kernel runs as launched. It is the same kernel, in the form whose launch the tiled
products rewrite (their grid then covers the M rows in blocks of 16). A row that is assigned, a launch of another
shape, a guard that already bounds the row otherwise: left as written.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._canonical import NARROW, WIDE, WIDE_TYPES, canonical, canonical_index
from klineage.transforms._edit import is_written, splice
from klineage.transforms._flatten import NoExtentParameter, grid_extent, with_extent_parameter
from klineage.transforms._naive import grid_index, launches_of, squash, statements
from klineage.transforms.base import NotApplicable

_LAYER = re.compile(rf"^(int|{'|'.join(sorted(WIDE_TYPES))}) ([A-Za-z_]\w*) = blockIdx\.y;$")


def rows_on_layers(parsed: cp.ParsedSource, function: cp.Function, state: KernelState) -> KernelState:
    """The state with the kernel's row read from its grid layer (above) written as the 2-D thread index, or
    NotApplicable."""
    listed = statements(function.node.child_by_field_name("body")) if function.is_kernel else []
    layers = [(node, _LAYER.match(squash(parsed.text(node)))) for node in listed[:2]]
    found = [(node, match) for node, match in layers if match]
    columns = [grid_index(parsed, node, wide=True) for node in listed[:2]]
    if len(listed) < 3 or len(found) != 1 or ("x", ) != tuple(axis for axis, _ in columns if axis):
        raise NotApplicable("no column on x and row from blockIdx.y declared first")
    declaration, (kind, row) = found[0][0], found[0][1].groups()
    column = next(name for axis, name in columns if axis == "x")
    if any(is_written(use) for use in cp.nodes_of_type(function.node, "identifier") if parsed.text(use) == row):
        raise NotApplicable(f"the row '{row}' is assigned")
    for launch in launches_of(state, function.name, dimensions=2):
        if str(launch.block[1]).strip() != "1":
            raise NotApplicable(f"{function.name}'s block is not 1-D, so the row is not blockIdx.y alone")
    try:
        rows = grid_extent(state, parsed, function, 1)
    except NoExtentParameter as missing:  # the grid alone carried the row count: the kernel takes it, read again
        state = with_extent_parameter(state, parsed, function, missing)
        parsed = cp.parse(state.source)
        return rows_on_layers(parsed, next(f for f in cp.functions(parsed) if f.name == function.name), state)
    guard = listed[2]
    condition = guard.child_by_field_name("condition")
    returning = squash(parsed.text(guard.child_by_field_name("consequence"))) in ("return;", "{ return; }")
    column_bound = re.fullmatch(rf"\({column} (<|>=) ([A-Za-z_]\w*)\)", squash(parsed.text(condition)))
    if guard.type != "if_statement" or column_bound is None or \
            column_bound[1] != (">=" if returning else "<") or guard.child_by_field_name("alternative") is not None:
        raise NotApplicable(f"the guard is not `{column} >= N` returning or `{column} < N` around the work")
    bound = f"({row} >= {rows} || {column} >= {column_bound[2]})" if returning else \
        f"({row} < {rows} && {column} < {column_bound[2]})"
    index = canonical_index(WIDE if kind in WIDE_TYPES else NARROW, "y")
    source = splice(parsed.data, [(declaration.start_byte, declaration.end_byte, f"{kind} {row} = {index};"),
                                  (condition.start_byte, condition.end_byte, bound)])[0]
    return canonical(KernelState(source=source.decode("utf-8"), plan=state.plan))
