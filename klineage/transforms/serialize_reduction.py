"""serialize_reduction: a warp that shares one row's passes becomes one thread that makes them alone.

The mechanism (forward): a kernel with one thread per row (`int row = blockIdx.x * blockDim.x +
threadIdx.x;`) that walks its row in sequential loops (`for (int j = 0; j < n; ++j)`) gets one warp per
row instead: the row index becomes the global thread index / 32, each lane takes the columns
j = lane, lane + 32, ... (the tail where n is no multiple of 32 is the loop's own bound), and every
scalar a loop reduces into (a sum: `acc += e`, `acc = acc + e`, `acc = e + acc`, `acc = fmaf(a, b, acc)`; a
product from one: `acc *= e`, `acc = acc * e`;
`acc = fmaxf(acc, e)` or `fmaxf(e, acc)`, `fminf`, `max`, `min`; `if (e > acc) acc = e;`, by `max`) is combined
across the warp right after its loop by a butterfly of `__shfl_xor_sync`, which leaves every lane with
the same value. A loop that is a running sum stored per column (`acc += e; y[...j...] = acc;`, a scan)
goes over the row in chunks of 32 columns instead: each lane takes one, an inclusive `__shfl_up_sync`
scan adds up the chunk, and the total of the earlier chunks (the accumulator, equal in every lane,
advanced by lane 31's value) is added to it. A running product (`acc *= e;`) is scanned with products, and a
store before the update (`y[...j...] = acc; acc += e;`, an exclusive scan) stores the prefix of the lanes
before (the accumulator alone in lane 0). A running sum or product walked down from the row's end (`for (int j =
n - 1; j >= 0; --j)`) is scanned with lane 0 on the last column. A loop that keeps the best value and its column
(`if (e > best) { best = e; at = j; }`, or `<`; it may start past column 0, as an argmax seeded with column 0 does)
strides the same way and its (value, index) pair is combined by a shuffle butterfly that gives the sequential
loop's answer to the bit, ties and NaNs included (klineage/transforms/_arg_reduction.py says why). The launch's grid
grows 32-fold (the plan's first grid dimension times 32), unless the rows are a number (`if (row < N)`) and a
launch of a number of blocks already holds N warps (a kernel one thread runs, read as one row on one warp by
`_flatten.py`): its grid stays. On memory-bound row kernels this turns 32 strided rows per warp into one coalesced
row.

Backward serializes the canonical form forward writes: the row index loses `/ 32`, the lane line and
the butterflies go, the loops start where they started (0, or the later column a loop with no sum may start
at) and step by one (a scan's chunks become its two statements again), the grid shrinks by 32.

Legality (forward_sites), conservative, decided on the parse:
- the kernel's block is one-dimensional with a size that is a multiple of 32 (so a warp never straddles two
  rows), and the row index is the only use of threadIdx and of blockIdx.x (the grid grows along x); a grid's y and
  z, the same in every lane of a block, stay the kernel's own (a batch on grid y);
- no shared memory, barrier, shuffle or `break`/`continue`/`goto`, and no call outside pure math (with the 16-bit
  conversions) and the source's pure helpers (`_calls.py`); no inner loop but a column's own (a linear layer's dot
  over k for column n: it assigns only names its column declares, writes no memory and names no accumulator of the
  row, so each lane runs it whole for its columns: `_warp_reduction._private_loop`);
- no atomic but a row's own, made once outside the loops: an `atomicAdd(P, v);` (or atomicMax, atomicMin)
  statement whose old value goes unused, into an array parameter the kernel names nowhere else (a row's term of a
  mean loss). The lanes of a row compute the same P and v there, and `if (lane == 0)` makes it once;
- each row loop sits directly in the kernel's body (or in an `if` there), and its body only declares locals,
  stores `a[...j...] = e` to an array (j one term of the subscript, alone or times a nonzero number, or times a
  scalar parameter that bounds the loop or the count the row's guard compares against, so never zero where the loop
  runs: `out[c * HW]`), or updates one of its accumulators (a reduction, a kept extreme, or an
  arg reduction: the one `if` after its declarations, a strict compare, the value and the loop index taken
  together);
- a sum accumulator starts at zero and a product at one (the 32 partials each start from it); a loop other than a
  running sum or product may start past column 0, at a number, a scalar parameter or a local the kernel declares
  once, none of them assigned (the same in every lane), and may stop below a second bound too (`j < n && j <
  split_first + split_steps`: a chunk of the row, which unsplit_reduction's forward writes, as its merge walks the
  chunks below `(n + split_steps - 1) / split_steps`);
- an accumulator is updated in one loop only, and outside it only after it (`mean /= n`: every lane then
  holds the combined value);
- an assignment or increment in a row loop is a statement of its own (or the loop's step): the value of one inside
  an expression is the serial running value, which no lane holds (`y[...j...] = (acc += e) * 0.5f`, `float v =
  (acc += e);`, `y[...j...] = acc++`), and a store of anything but the running value itself is no scan the warp
  computes;
- no accumulator's address is taken and no reference binds one (`float* p = &acc;`, `float& r = acc;`): a read
  through it inside the loop would see one lane's partial;
- an array the kernel writes is never read (32 lanes now run the code outside the loops: their stores carry
  equal values, and no lane reads what another wrote);
- some loop may take 32 steps or more: where every loop's start and bound are numbers or the source's constants
  and each takes fewer steps than the lanes a row would get (a pooling window, a stencil's taps), the lanes would
  outnumber the elements (the block form refuses likewise under 256).
Anything else: no site. The row index may be spelled any way `_canonical.py` reads as
`int row = blockIdx.x * blockDim.x + threadIdx.x;`. Two perfectly nested loops from 0 below counts of scalar
parameters (`for (int n = 0; n < N; ++n) for (int k = 0; k < HW; ++k)`) are read as one loop over their pairs,
in the nest's order (`_nests.py`), whose steps the lanes stride.

Spellings read as the forms above (`_scan_spellings.respelled`, before the legality is decided, for every warp
reduction; the rewrite computes the same values, and the forward's output is the one of the form it reads): a
scan's update written `acc = acc + e` or `acc = e + acc` (`*`, a product: either order gives the same bits); its
value first held by a temporary of the accumulator's type that nothing else names (`float v = e; acc += v;`, or
`const float v`: the scan's own `scan_value = e` converts e as v did); or its store taking the assignment's value
(`y[...j...] = (acc += e);`, `y[...j...] = acc += e;`, `y[...j...] = acc = acc + e;`: the value of an assignment is
its variable's after it). Each is the scan's two statements `acc += e; y[...j...] = acc;` (the store first in an
exclusive scan). A temporary of another type (`double v = e;` into a float sum: rounded once a step in double)
stays as written, and the sum is then read beyond its own update: no site. C's spellings of locals and loops are
`_canonical.py`'s to read (`_c_style.py`: `float sum; ... sum = 0.0f;` declared where it is set, `int j; for (j =
0; ...)` loops that declare their index). What it leaves is no site, with its reason: a loop index declared outside
its loop and named outside the loops that set it (read after a loop, each lane would hold its own last index), a
variable a loop updates declared without a value and first named other than by an assignment statement of its
block (set inside an `if`, read first: no start every lane shares).

Anchor: the kernel, kind "function", key the row variable.
"""

from __future__ import annotations

from klineage.transforms import register
from klineage.transforms._warp_reduction import ROWS, WarpReduction


class SerializeReduction(WarpReduction):
    name = "serialize_reduction"
    intent = ("Give each row a warp instead of a thread: lanes stride the row's loops and combine what the loops "
              "reduce with warp shuffles, so a row is read with coalesced loads.")
    layout = ROWS


register(SerializeReduction())
