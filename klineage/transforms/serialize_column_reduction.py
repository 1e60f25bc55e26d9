"""serialize_column_reduction: the four lanes that share a column's walk down a matrix become one thread.

The mechanism (forward): a kernel with one thread per column (`int c = blockIdx.x * blockDim.x + threadIdx.x;`)
whose loops walk down the rows (`for (int r = 0; r < rows; ++r) s += x[r * cols + c];`) has only `cols` threads,
each with a long chain of loads: where columns number in the thousands the GPU holds a warp or two per SM and waits
on memory. Forward gives each column 4 lanes. A warp holds 8 adjacent columns; lanes c, c + 8, c + 16 and c + 24
of the warp take column c, each walking every 4th row from its slice (0 to 3), and what the loops reduce is combined
by shuffles among those 4 lanes (offsets 16 and 8, under the mask of the 4), which leaves each of them the
column's value. One load of the warp is then 8 adjacent elements of 4 rows (a 32-byte sector each, for 4-byte
elements), and the grid grows 4-fold. serialize_reduction gives a column a whole warp instead, whose 32 lanes
read 32 rows of one column: more lanes for very few columns, a sector per element read. Both offer their site;
the gate and the cards' preconditions say which pays where.

The column is serialize_reduction's row seen the other way, so the reading, the legality and the rewrite are
that transform's (klineage/transforms/_warp_reduction.py, described in serialize_reduction.py) with a warp laid out
as 8 columns of 4 lanes, plus:
- every subscript in a loop that names both the loop index and the column adds the column as a term of its own
  (`x[(long long)r * cols + c]`) and never the loop index alone (a walk down a column, not along a row), and at
  least one does;
- no running sum (a scan down a column would need its 4 lanes to pass partial sums along).
A column's 4 lanes leave together (an early `return` past the last column) or stay together, so the lanes a
shuffle's mask names all reach it.

Backward writes the one-thread-per-column form back: the column index loses its warp layout, the slice and mask
lines and the butterflies go, the loops step by one from where they started, the grid shrinks by 4.

Anchor: the kernel, kind "function", key the column variable.
"""

from __future__ import annotations

import re

from klineage.features import cuda_parser as cp
from klineage.transforms import register
from klineage.transforms._edit import summands
from klineage.transforms._warp_reduction import Layout, RowLoop, WarpReduction
from klineage.transforms.base import NotApplicable


class SerializeColumnReduction(WarpReduction):
    name = "serialize_column_reduction"
    intent = ("Give each column four lanes instead of one thread: a warp walks 8 adjacent columns down 4 rows at a "
              "time and combines each column's reductions with shuffles among its lanes, so a column-wise reduction "
              "has 4 times the threads and reads whole sectors.")
    layout = Layout(8)

    def _check_direction(self, parsed: cp.ParsedSource, row: str, loops: list[RowLoop]) -> None:
        down = 0
        for loop in loops:
            if loop.scan is not None:
                raise NotApplicable(f"a running sum down '{row}' (its lanes would pass partial sums along)")
            for subscript in cp.nodes_of_type(loop.node, "subscript_expression"):
                indices = subscript.child_by_field_name("indices")
                text = parsed.text(indices)
                if not (re.search(rf"\b{loop.index}\b", text) and re.search(rf"\b{row}\b", text)):
                    continue
                terms = [parsed.text(term) for term in summands(parsed, indices.named_children[0])]
                if row not in terms or loop.index in terms:
                    raise NotApplicable(f"`{parsed.text(subscript)}` does not walk down a column: '{row}' is not "
                                        f"one of its terms, or '{loop.index}' is")
                down += 1
        if not down:
            raise NotApplicable(f"no subscript names both '{row}' and a loop index: nothing walks down a column")


register(SerializeColumnReduction())
