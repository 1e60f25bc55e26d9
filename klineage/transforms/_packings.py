"""The 16-byte packings the packed-element transforms share (scalarize_elementwise, scalarize_half_packs,
scalarize_row_gather): how many elements a pack holds, its C++ type per element type, how a lane is named
and how a pack is loaded or declared. Here, not in one transform, because a transform imports no other."""

from __future__ import annotations

from klineage.transforms._calls import MATH_CALLS
from klineage.transforms._elementwise import Packing

WORD_WIDTH = 4
COMPONENTS = ("x", "y", "z", "w")
# 64-bit elements four to a 32-byte vector of 16-byte alignment (two 16-byte accesses, which the same check covers;
# CUDA 13's `_16a` types): an int64 index of a gather beside its floats, or float64 data. Each C++ spelling keeps
# its own vector type (`int64_t` is `long` here, not `long long`), so a lane reads the type the kernel declared.
_WIDE = {**dict.fromkeys(("long long", "long long int", "signed long long"), "longlong4_16a"),
         **dict.fromkeys(("unsigned long long", "unsigned long long int"), "ulonglong4_16a"),
         **dict.fromkeys(("long", "long int", "int64_t", "ptrdiff_t"), "long4_16a"),
         **dict.fromkeys(("unsigned long", "uint64_t", "size_t"), "ulong4_16a"),
         "double": "double4_16a"}
# 32-bit elements four to a 16-byte vector, and 8-bit ones (a mask, a quantized value) four to the 4-byte vector
# that rides beside them: the vector path's 16-byte alignment check covers theirs; a bool mask is read as bytes too
# (`READ_ONLY`)
VECTORS = {"float": "float4", "int": "int4", "unsigned": "uint4", "unsigned int": "uint4",
           **dict.fromkeys(("unsigned char", "uint8_t", "bool"), "uchar4"),
           **dict.fromkeys(("signed char", "int8_t"), "char4"), **_WIDE}


def _declare_words(array: str, element: str, vector: str, index: str, read: bool, written: bool) -> list[str]:
    if not read:
        return [f"{vector} {array}{WORD_WIDTH};"]
    const = "" if written else "const "
    return [f"{const}{vector} {array}{WORD_WIDTH} = *reinterpret_cast<const {vector}*>({array} + {index});"]


WORDS = Packing(WORD_WIDTH, VECTORS, "float, double, int, unsigned, 64-bit or 8-bit integers", MATH_CALLS,
                rf"\w+{WORD_WIDTH}", lambda array, lane: f"{array}{WORD_WIDTH}.{COMPONENTS[lane]}", _declare_words)

# 16-bit elements, eight to a pack, reached through an element view of the pack
HALF_WIDTH = 8
HALF_PACK = "uint4"
HALF_PACKS = dict.fromkeys(("__half", "half", "__nv_bfloat16", "nv_bfloat16"), HALF_PACK)
# conversions and arithmetic on 16-bit values (cuda_fp16.h, cuda_bf16.h): pure, like the math functions
HALF_CALLS = frozenset({
    "__half2float", "__float2half", "__float2half_rn", "__bfloat162float", "__float2bfloat16",
    "__float2bfloat16_rn", "__hadd", "__hsub", "__hmul", "__hdiv", "__hfma", "__hneg", "__habs", "__hmax", "__hmin",
    "hexp", "hlog", "hsqrt", "hrsqrt", "htanh", "__hgt", "__hlt", "__hge", "__hle", "__heq"})


def _half_view(array: str) -> str:
    return f"{array}{HALF_WIDTH}h"


def _declare_halves(array: str, element: str, pack: str, index: str, read: bool, written: bool) -> list[str]:
    const = "" if written else "const "
    load = f" = *reinterpret_cast<const {pack}*>({array} + {index})" if read else ""
    return [f"{const}{pack} {array}{HALF_WIDTH}{load};",
            f"{const}{element}* {_half_view(array)} = reinterpret_cast<{const}{element}*>(&{array}{HALF_WIDTH});"]


HALVES = Packing(HALF_WIDTH, HALF_PACKS, "__half or __nv_bfloat16", MATH_CALLS | HALF_CALLS, rf"\w+{HALF_WIDTH}h?",
                 lambda array, lane: f"{_half_view(array)}[{lane}]", _declare_halves)
