"""scalarize_elementwise: a thread's four elements, read and written as 16-byte vectors, become one element.

The mechanism (forward): an elementwise kernel, one thread per element (`int i = blockIdx.x * blockDim.x +
threadIdx.x; if (i < n) <body>` where the body writes arrays only at `[i]`), gets four consecutive elements per
thread: `i` becomes the thread index times 4, and where the four are in bounds and every array is 16-byte aligned
(checked at run time on the pointers) each array the body reads at `[i]` is loaded once as a
`float4`/`int4`/`uint4`, the body runs once per component on registers (a read elsewhere, a neighbour `x[i + 1]` or
a gather `t[idx[i]]`, and any other use of the index, read with that component's own index), and each array it
writes is stored once as a vector; otherwise (the tail where n is no multiple of 4, or a misaligned pointer) the
body runs element by element over what is left of the four. The launch's first grid dimension becomes a quarter,
rounded up: cdiv(grid, 4) blocks still give every four elements a thread.

A kernel of one thread per pair (a rotary embedding on interleaved pairs: `y[2 * i]` and `y[2 * i + 1]` from
`x[2 * i]`, `x[2 * i + 1]` and the pair's `cos_t[i]`) takes two pairs per thread the same way: a pair's two
elements are lanes 2p and 2p + 1 of each float4, `i` becomes the thread index times 2, the guard `i + 1 < n`, the
tail a loop over what is left of the two pairs, the grid a half. Groups of k elements at `[k * i + j]` take
4 / k groups a thread wherever that is two or more (16-bit data: pairs and groups of 4, scalarize_half_packs).

A kernel of one thread per half-split pair (the GPT-NeoX / Llama "rotate_half" layout: `r = p / half, j = p %
half`, the pair at `r * 2 * half + j` and that `+ half`, its cos and sin at `r * half + j`) takes four pairs per
thread: one float4 of each array at each offset, under `p + 3 < n && half % 4 == 0` and the pointers' alignment,
the element loop otherwise (`_rotate_half.py` reads and writes it; backward is the same element loop's).

Backward scalarizes the canonical form forward writes, from its element loop: one element per thread
again, the grid back to what it was.

Legality (forward_sites), conservative, decided on the parse: the element index is the only use of threadIdx, and
the body never writes or declares it; every array the body touches at `[i]` is a pointer parameter to `float`,
`int` or `unsigned`; an array it touches anywhere else is a pointer parameter the body only reads (a lane could
otherwise read what another lane's store has not yet written); the body has no loop, barrier, shared memory,
atomic, shuffle, `return` or call outside pure math and the source's pure helpers (`_calls.py`); an array the body
writes is read before (its vector is loaded) or stored on every path through the body: by a statement of its top
level, or by both branches of an if/else (`_elementwise.stored_on_every_path`; every component gets a value; of a
pair, both elements); the launch is one-dimensional and passes no buffer twice. Scalar locals
may stand before the index and between it and the guard (`int cols = ca + cb;`, `const float one = 1.f;`:
`_naive.scalar_locals`, values of parameters, constants and literals through arithmetic and pure math, never
assigned, named neither `e` nor as a pack): they stay where they are, before the vector guard and the tail; one
that names the index (`int r = i / cols;`) moves into the body first (`_naive.sunk`), computed per lane. Anything
else there, a local of a thread coordinate say, is refused: every lane would read one thread's value. The bound
is a name, a product or sum of names, a cast count, or
integer arithmetic on the scalar parameters, constants and those locals (`rows * (ca + cb)`), none of which the
kernel assigns (the tail reads it again). Anything else: no site.

Anchor: the kernel, kind "function", key the element index.
"""

from __future__ import annotations

from klineage.transforms import register
from klineage.transforms._elementwise import PackedElementwise, serial_site
from klineage.transforms._packings import WORDS
from klineage.transforms._rotate_half import NotSplit, half_site
from klineage.transforms.base import NotApplicable


class ScalarizeElementwise(PackedElementwise):
    name = "scalarize_elementwise"
    intent = ("Give each thread four consecutive elements of an elementwise kernel and move them as 16-byte "
              "vector loads and stores, with a scalar path for the tail and for misaligned pointers.")
    removes = ("vector_type_float4",)
    packing = WORDS
    element = "element"
    pack = "vectors"

    def site(self, state, parsed, function):
        """The elementwise reading first; where it refuses a kernel whose work splits its index into a row and a
        pair (`r = p / half, j = p % half`), the half-split pairs' reading (`_rotate_half.py`); a kernel both
        refuse is refused with both reasons. One transform, not a second one: the same mechanism (float4 lanes,
        the runtime guard, the element loop that `unpacked` reads back), so its backward and cards are this one's."""
        try:
            return serial_site(state, parsed, function, self.packing)
        except NotApplicable as serial:
            try:
                return half_site(state, parsed, function, self.packing)
            except NotSplit:
                raise serial from None
            except NotApplicable as halves:  # both readings' reasons: a split transpose is no rotary kernel
                if str(halves) == str(serial):  # the header both read the same way
                    raise
                raise NotApplicable(f"{serial}; read as half-split pairs: {halves}") from None


register(ScalarizeElementwise())
