"""What the read-only-cache transforms share (ldg, ldg_subscript): the element types `__ldg` loads; and what the
analysis forwards read an `__ldg` subscript as.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import plain_read_edits, splice

# The element types `__ldg` has overloads for.
LDG_TYPES = frozenset({"char", "signed char", "unsigned char", "short", "unsigned short", "int", "unsigned int",
                       "unsigned", "long", "unsigned long", "long long", "unsigned long long", "float", "double",
                       "char2", "char4", "uchar2", "uchar4", "short2", "short4", "ushort2", "ushort4", "int2", "int4",
                       "uint2", "uint4", "longlong2", "ulonglong2", "float2", "float4", "double2", "__half", "__half2",
                       "__nv_bfloat16", "__nv_bfloat162"})


def plain_reads(state: KernelState) -> KernelState:
    """`state` with every `__ldg(&a[k])` read as `a[k]` (the same state where there is none), for the analysis
    forwards that read a kernel's subscripts (elementwise packs, row gathers, transpose tiles): an author's read
    through the read-only cache is a plain read of the same value, and their vector or tiled form reads it anew.
    A call inside another's subscript (`__ldg(&t[__ldg(&idx[i])])`) is read on a later pass."""
    while True:
        parsed = cp.parse(state.source)
        edits = plain_read_edits(parsed, parsed.root)
        if not edits:
            return state
        state = KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)
