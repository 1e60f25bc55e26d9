"""What the read-only-cache transforms share (ldg, ldg_subscript): the element types `__ldg` loads.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

# The element types `__ldg` has overloads for.
LDG_TYPES = frozenset({"char", "signed char", "unsigned char", "short", "unsigned short", "int", "unsigned int",
                       "unsigned", "long", "unsigned long", "long long", "unsigned long long", "float", "double",
                       "char2", "char4", "uchar2", "uchar4", "short2", "short4", "ushort2", "ushort4", "int2", "int4",
                       "uint2", "uint4", "longlong2", "ulonglong2", "float2", "float4", "double2", "__half", "__half2",
                       "__nv_bfloat16", "__nv_bfloat162"})
