"""scalarize_half_packs: a thread's eight 16-bit elements, read and written as 16-byte packs, become one element.

The mechanism (forward): scalarize_elementwise's, at the width of 16-bit data. An elementwise kernel over
`__half` or `__nv_bfloat16` arrays, one thread per element (`int i = blockIdx.x * blockDim.x + threadIdx.x;
if (i < n) <body>`, the body writing arrays only at `[i]`), gets eight consecutive elements per thread: where
the eight are in bounds and every array is 16-byte aligned (checked at run time on the pointers) each array the
body reads is loaded once as a `uint4` and read through an element view of it (`const __half* x8h`), the body
runs once per element on registers and each array it writes is stored once as a `uint4`; otherwise (the tail
where n is no multiple of 8, or a misaligned pointer) the body runs element by element over what is left of the
eight. The launch's first grid dimension becomes an eighth, rounded up. One thread per pair (`y[2 * i]`,
`y[2 * i + 1]`) or group of 4 elements takes four pairs or two groups a thread.

Backward scalarizes the form forward writes, from its element loop: one element per thread again, the grid
back to what it was.

Legality (forward_sites) is scalarize_elementwise's analysis (`_elementwise.serial_site`) with 16-bit element
types: every array the body touches at `[i]` is a pointer parameter to `__half`, `half`, `__nv_bfloat16` or
`nv_bfloat16` (mixed 16-bit types pack alike); the body calls only pure math, the source's pure helpers (`_calls.py`)
and the 16-bit conversion and arithmetic intrinsics. A kernel over 32-bit data is scalarize_elementwise's, not
this one's.

Anchor: the kernel, kind "function", key the element index.
"""

from __future__ import annotations

from klineage.transforms import register
from klineage.transforms._elementwise import PackedElementwise
from klineage.transforms._packings import HALVES


class ScalarizeHalfPacks(PackedElementwise):
    name = "scalarize_half_packs"
    intent = ("Give each thread eight consecutive 16-bit (half or bf16) elements of an elementwise kernel and move "
              "them as 16-byte loads and stores, with a scalar path for the tail and for misaligned pointers.")
    removes = ("vector_type_int4",)
    kin = ("scalarize_elementwise",)  # its cards are this mechanism at 32-bit width
    packing = HALVES
    element = "16-bit element"
    pack = "packs"


register(ScalarizeHalfPacks())
