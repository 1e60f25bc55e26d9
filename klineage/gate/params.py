"""Kernel parameter buffers: the bytes a launch hands to cuLaunchKernel, laid out as the kernel
declares its parameters, and TMA tensor maps encoded for them.

A kernel's parameters sit in one buffer in declaration order, each at its natural alignment:
pointers 8, i32/u32/f32 4, i64/u64/f64 8, a CUtensorMap (128 bytes, `alignas(64)`) 64. The
alignment is that of the constant bank the driver copies the buffer into, whose parameter area
starts at an address that is only 16-byte aligned (0x210 on sm_90): ptxas puts a 64-byte aligned
parameter where its *bank* address is a multiple of 64, so the first CUtensorMap of a kernel sits
at buffer offset 0x30, not 0. The cubin records every parameter's offset and size and the
buffer's size (EIATTR_KPARAM_INFO, EIATTR_CBANK_PARAM_SIZE in .nv.info.<kernel>), and those are
what the buffer follows (`read_kernel_parameters`); where they cannot be read, or disagree with a
plan that passes no tensor map, the natural layout from offset 0 is used, which is what pycuda
packed from individual arguments before.

pycuda packs the arguments it is given one after another with its own struct rules, so the
runner packs the whole buffer here and hands pycuda words that its packing reproduces byte for
byte (`as_pycuda_words`). For plans without tensor maps the buffer is exactly what pycuda packed
from the individual arguments before.

Importable without a GPU: numpy and the CUDA driver (libcuda.so.1, through ctypes) are loaded
only by the functions that need them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from klineage.errors import DocumentError
from klineage.launch import TENSOR_MAP_DTYPES, TENSOR_MAP_L2_PROMOTIONS, TENSOR_MAP_SWIZZLES, Arg, ArgKind, TensorMap

TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap)
TENSOR_MAP_ALIGN = 64  # the alignment cuTensorMapEncodeTiled and a __grid_constant__ parameter need
# Argument kind -> (bytes, alignment) in the parameter buffer. "buffer" is a device pointer.
PARAMETER_ABI = {
    "buffer": (8, 8), "i32": (4, 4), "u32": (4, 4), "i64": (8, 8), "u64": (8, 8), "f32": (4, 4), "f64": (8, 8),
    "tensor_map": (TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN),
}
SCALAR_NUMPY = {"i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64", "f32": "float32", "f64": "float64"}


class TensorMapError(Exception):
    """A tensor map the driver refuses, that does not fit the buffer it maps, or that the kernel's
    parameters have no place for."""


@dataclass(frozen=True)
class KernelParameters:
    """A kernel's parameters as its cubin declares them."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    total: int  # bytes of the whole parameter buffer (any leading alignment padding included)


# .nv.info records: a 4-byte header (format, attribute, u16 value or payload size), then the payload.
_EIFMT_SVAL = 4  # the u16 is the size of a payload that follows
_EIATTR_KPARAM_INFO = 0x17  # payload: u32 index, u16 ordinal, u16 offset, u32 flags (size in bits 18-31)
_EIATTR_CBANK_PARAM_SIZE = 0x19  # u16 value: bytes of the parameter buffer
_SHT_CUDA_INFO = 0x70000000


def read_kernel_parameters(cubin: bytes, symbol: str) -> KernelParameters | None:
    """The parameter table of kernel `symbol` (its mangled name) in an ELF64 cubin; None when
    the cubin has no readable table for it."""
    try:
        if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:  # 64-bit little-endian
            return None
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
        names_at = headers[shstrndx][4]
        wanted = f".nv.info.{symbol}".encode()
        for name, kind, _, _, offset, size in headers:
            start = names_at + name
            if kind != _SHT_CUDA_INFO or cubin[start:cubin.index(b"\0", start)] != wanted:
                continue
            return _parse_info(cubin[offset:offset + size])
    except (struct.error, IndexError, ValueError):
        return None
    return None


def _parse_info(records: bytes) -> KernelParameters | None:
    params: dict[int, tuple[int, int]] = {}
    total = None
    at = 0
    while at + 4 <= len(records):
        fmt, attr, value = records[at], records[at + 1], struct.unpack_from("<H", records, at + 2)[0]
        payload = records[at + 4:at + 4 + value] if fmt == _EIFMT_SVAL else b""
        if attr == _EIATTR_KPARAM_INFO and fmt == _EIFMT_SVAL and len(payload) >= 12:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
            params[ordinal] = (offset, flags >> 18)
        elif attr == _EIATTR_CBANK_PARAM_SIZE and fmt != _EIFMT_SVAL:
            total = value
        at += 4 + (value if fmt == _EIFMT_SVAL else 0)
    if total is None or sorted(params) != list(range(len(params))):
        return None
    ordered = [params[i] for i in range(len(params))]
    return KernelParameters(tuple(o for o, _ in ordered), tuple(s for _, s in ordered), total)


def check_arguments(args: Sequence[Arg], declared: KernelParameters | None, entry: str) -> None:
    """A plan's arguments for `entry` must match the parameters its cubin declares, one for one and
    in size: otherwise the launch would pack them anyway and the kernel would read garbage.
    DocumentError names the first argument that does not fit."""
    where = f"launch of '{entry}'"
    if declared is None:
        if args:
            raise DocumentError(where, f"the plan passes {len(args)} arguments, but the cubin declares no "
                                       f"parameters for this entry")
        return
    if len(args) != len(declared.sizes):
        extra = (f"; argument {len(declared.sizes)} ({_described(args[len(declared.sizes)])}) has no parameter"
                 if len(args) > len(declared.sizes) else f"; parameter {len(args)} gets no argument")
        raise DocumentError(where, f"the plan passes {len(args)} arguments; the kernel declares "
                                   f"{len(declared.sizes)} parameters of {list(declared.sizes)} bytes{extra}")
    for index, (arg, size) in enumerate(zip(args, declared.sizes)):
        given = PARAMETER_ABI[_abi_kind(arg)][0]
        if given != size:
            raise DocumentError(where, f"argument {index} ({_described(arg)}) is {given} bytes; the kernel's "
                                       f"parameter {index} is {size} bytes")


def _abi_kind(arg: Arg) -> str:
    return arg.type if arg.kind is ArgKind.SCALAR else arg.kind.value


def _described(arg: Arg) -> str:
    if arg.kind is ArgKind.SCALAR:
        return f"scalar {arg.value!r} of type {arg.type}"
    return f"{'buffer' if arg.kind is ArgKind.BUFFER else 'tensor map over'} '{arg.name}'"


@dataclass(frozen=True)
class Slot:
    """Where one argument sits in the parameter buffer."""

    kind: str  # "buffer", "tensor_map" or a scalar type
    offset: int
    size: int


def slot_kind(arg: Sequence[Any]) -> str:
    kind, _, extra = arg
    return extra if kind == "scalar" else kind


def natural_layout(args: Sequence[Sequence[Any]]) -> tuple[tuple[Slot, ...], int]:
    """Each argument at its natural alignment from offset 0, and the buffer's size: the end of the
    last argument (no tail padding), as pycuda packs separate arguments."""
    slots, offset = [], 0
    for arg in args:
        kind = slot_kind(arg)
        size, align = PARAMETER_ABI[kind]
        offset += -offset % align
        slots.append(Slot(kind, offset, size))
        offset += size
    return tuple(slots), offset


def parameter_layout(args: Sequence[Sequence[Any]], declared: KernelParameters | None = None,
                     entry: str = "the kernel") -> tuple[tuple[Slot, ...], int]:
    """Where a resolved launch's arguments go: at the offsets the kernel declares when its
    parameters match the arguments one for one in size; otherwise the natural layout, which a
    launch with a tensor map cannot use (TensorMapError)."""
    natural, total = natural_layout(args)
    matches = declared is not None and declared.sizes == tuple(slot.size for slot in natural)
    if matches:
        return tuple(Slot(s.kind, o, s.size) for s, o in zip(natural, declared.offsets)), declared.total
    if any(slot.kind == "tensor_map" for slot in natural):
        if declared is None:
            raise TensorMapError(f"the cubin has no parameter table for {entry}, so its tensor maps cannot be placed")
        raise TensorMapError(f"the plan passes {len(natural)} arguments of {[s.size for s in natural]} bytes; "
                             f"{entry} declares {len(declared.sizes)} parameters of {list(declared.sizes)} bytes")
    return natural, total


def pack_parameters(args: Sequence[Sequence[Any]], pointers: Mapping[str, int],
                    tensor_maps: Mapping[int, bytes] | None = None, declared: KernelParameters | None = None,
                    entry: str = "the kernel") -> bytes:
    """The parameter buffer of one launch: `pointers` by buffer name, `tensor_maps` (encoded,
    128 bytes each) by argument index, at the offsets `declared` by the cubin (see
    parameter_layout). Padding bytes are zero."""
    import numpy as np

    slots, total = parameter_layout(args, declared, entry)
    blob = bytearray(total)
    for index, ((kind, value, extra), slot) in enumerate(zip(args, slots)):
        if kind == "buffer":
            data = np.uintp(pointers[value]).tobytes()
        elif kind == "tensor_map":
            data = (tensor_maps or {})[index]
        else:
            data = getattr(np, SCALAR_NUMPY[extra])(value).tobytes()
        if len(data) != slot.size:
            raise ValueError(f"argument {index} ({slot.kind}) packs to {len(data)} bytes, not {slot.size}")
        blob[slot.offset:slot.offset + slot.size] = data
    return bytes(blob)


def as_pycuda_words(blob: bytes) -> list[Any]:
    """numpy scalars whose pycuda packing is `blob` itself: 8-byte words, then a 4-, 2- and
    1-byte tail. Each word starts at an offset its own alignment divides, so pycuda's struct
    packing inserts no padding; numbers (unlike a void scalar) also pass pycuda's argument cache."""
    import numpy as np

    words: list[Any] = list(np.frombuffer(blob, dtype="<u8", count=len(blob) // 8))
    offset = len(blob) // 8 * 8
    for width, dtype in ((4, "<u4"), (2, "<u2"), (1, "u1")):
        if len(blob) - offset >= width:
            words.append(np.frombuffer(blob, dtype=dtype, count=1, offset=offset)[0])
            offset += width
    return words


def check_tensor_map_buffer(name: str, spec: TensorMap, address: int, nbytes: int, dtype: str) -> None:
    """A map must describe memory of its buffer only, with the element type it declares."""
    expected = TENSOR_MAP_DTYPES[spec.dtype][2]
    if dtype != expected:
        raise TensorMapError(f"tensor map over '{name}' declares dtype {spec.dtype} ({expected}); "
                             f"the buffer holds {dtype}")
    if address % 16:
        raise TensorMapError(f"tensor map over '{name}': the buffer's address is not 16-byte aligned")
    if spec.extent_bytes > nbytes:
        raise TensorMapError(f"tensor map over '{name}' spans {spec.extent_bytes} bytes (dims {list(spec.dims)}, "
                             f"strides {list(spec.strides)}); the buffer has {nbytes}")


@functools.cache
def _driver() -> Any:
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    encode = lib.cuTensorMapEncodeTiled
    encode.restype = ctypes.c_int
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                       ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def encode_tensor_map(name: str, spec: TensorMap, address: int) -> bytes:
    """The 128-byte CUtensorMap for `spec` over device memory at `address` (a context must be
    current): tiled, no interleave, element strides 1, out-of-bounds elements read as zeros."""
    import ctypes

    lib = _driver()
    rank = len(spec.dims)
    storage = (ctypes.c_uint8 * (TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN))()
    skew = -ctypes.addressof(storage) % TENSOR_MAP_ALIGN
    dims = (ctypes.c_uint64 * rank)(*spec.dims)
    strides = (ctypes.c_uint64 * max(1, rank - 1))(*spec.strides)
    box = (ctypes.c_uint32 * rank)(*spec.box)
    element_strides = (ctypes.c_uint32 * rank)(*([1] * rank))
    interleave_none, oob_fill_zeros = 0, 0  # CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
    status = lib.cuTensorMapEncodeTiled(
        ctypes.addressof(storage) + skew, TENSOR_MAP_DTYPES[spec.dtype][0], rank, address, dims, strides, box,
        element_strides, interleave_none, TENSOR_MAP_SWIZZLES[spec.swizzle][0],
        TENSOR_MAP_L2_PROMOTIONS[spec.l2_promotion], oob_fill_zeros)
    if status != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorName(status, ctypes.byref(text))
        what = text.value.decode() if text.value else f"CUresult {status}"
        raise TensorMapError(f"cuTensorMapEncodeTiled refused the map over '{name}' ({what}): dtype {spec.dtype}, "
                             f"dims {list(spec.dims)}, strides {list(spec.strides)}, box {list(spec.box)}, "
                             f"swizzle {spec.swizzle}")
    return bytes(storage[skew:skew + TENSOR_MAP_BYTES])
