"""Kernel parameter buffers, checked without a GPU: where each argument of a launch goes in the
buffer the runner hands to cuLaunchKernel (natural alignment, or the offsets the cubin declares,
which put a 64-byte aligned CUtensorMap at a constant-bank address that is a multiple of 64),
that plans without tensor maps pack exactly as pycuda packed their separate arguments, that the
words given to pycuda reproduce the buffer byte for byte, and that a tensor map must fit its buffer.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from klineage.gate.params import (
    KernelParameters,
    Slot,
    TensorMapError,
    as_pycuda_words,
    check_tensor_map_buffer,
    natural_layout,
    pack_parameters,
    parameter_layout,
    read_kernel_parameters,
)
from klineage.launch import TensorMap
from klineage.toolchain import find_toolchain, run_tool

POINTERS = {"a": 0x7F00_0000_1000, "b": 0x7F00_0000_2200, "c": 0x7F00_0000_3300}
STRUCT = {"buffer": "Q", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}
MAP = TensorMap("bf16", (256, 1000), (512,), (64, 128), "128B", "256B")


def buffer(name):
    return ("buffer", name, "")


def scalar(value, kind="i32"):
    return ("scalar", value, kind)


def tmap(name="a"):
    return ("tensor_map", name, MAP)


def pycuda_style(args) -> bytes:
    """What pycuda packed from one numpy scalar per argument: its struct rules in native mode."""
    codes = "".join(STRUCT["buffer" if a[0] == "buffer" else a[2]] for a in args)
    values = [POINTERS[a[1]] if a[0] == "buffer" else a[1] for a in args]
    return struct.pack("@" + codes, *values)


# ---------------------------------------------------------------------------------------------
# Natural layout: what every plan without a tensor map gets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    [buffer("a"), buffer("b"), buffer("c"), scalar(4096), scalar(4095), scalar(4100)],  # the GEMM experts
    [buffer("a"), buffer("b"), scalar(7), scalar(8)],
    [scalar(-3), buffer("a"), scalar(2.5, "f32"), scalar(1 << 40, "i64")],  # padding before the pointer and i64
    [scalar(1), scalar(2, "u32"), scalar(0.5, "f64"), scalar(9, "u64"), scalar(-1, "i32")],
    [scalar(1.25, "f32")],
    [],
])
def test_plans_without_tensor_maps_pack_as_pycuda_did(args):
    blob = pack_parameters(args, POINTERS)
    assert blob == pycuda_style(args)
    words = as_pycuda_words(blob)
    assert struct.pack("@" + "".join(np.dtype(type(w)).char for w in words), *words) == blob


def test_natural_offsets_and_padding():
    args = [scalar(1), buffer("a"), scalar(2, "f32"), scalar(3, "f64"), scalar(4), tmap(), scalar(5, "u32")]
    slots, total = natural_layout(args)
    assert slots == (Slot("i32", 0, 4), Slot("buffer", 8, 8), Slot("f32", 16, 4), Slot("f64", 24, 8),
                     Slot("i32", 32, 4), Slot("tensor_map", 64, 128), Slot("u32", 192, 4))
    assert total == 196  # the end of the last argument: no tail padding
    declared = KernelParameters(tuple(s.offset for s in slots), tuple(s.size for s in slots), total)
    blob = pack_parameters(args, POINTERS, {5: bytes(range(128))}, declared)
    assert blob[4:8] == bytes(4) and blob[36:64] == bytes(28)  # padding is zero
    assert blob[64:192] == bytes(range(128))
    assert struct.unpack_from("<i4xQf4xdi", blob, 0) == (1, POINTERS["a"], 2.0, 3.0, 4)
    assert struct.unpack_from("<I", blob, 192)[0] == 5


@pytest.mark.parametrize("length", range(0, 41))
def test_pycuda_words_reproduce_any_buffer(length):
    blob = bytes((7 * i + 3) % 256 for i in range(length))
    words = as_pycuda_words(blob)
    assert struct.pack("@" + "".join(np.dtype(type(w)).char for w in words), *words) == blob
    assert all(isinstance(w, np.number) for w in words)  # hashable: pycuda may cache argument tuples
    hash(tuple(words))


def test_scalars_convert_as_numpy_does():
    blob = pack_parameters([scalar(0.1, "f32"), scalar(2**32 - 1, "u32"), scalar(-(2**63), "i64")], {})
    assert blob[:4] == np.float32(0.1).tobytes() and blob[4:8] == b"\xff" * 4
    assert struct.unpack_from("<q", blob, 8)[0] == -(2**63)


# ---------------------------------------------------------------------------------------------
# Declared layouts: the offsets ptxas chose, read from the cubin
# ---------------------------------------------------------------------------------------------

PROBE = r"""
struct alignas(64) TensorMap { unsigned long long opaque[16]; };
extern "C" __global__ void probe(int a, const __grid_constant__ TensorMap m, float* p, double d,
                                 const __grid_constant__ TensorMap m2, int b)
{
    p[0] = a + d + b + m.opaque[3] + m2.opaque[5];
}
extern "C" __global__ void plain(const float* x, float* y, int n, long long m) { y[0] = x[n] + m; }
"""


@cache
def probe_cubin() -> bytes:
    toolchain = find_toolchain()
    work = Path(tempfile.mkdtemp(prefix="kparams-"))
    (work / "probe.cu").write_text(PROBE)
    build = subprocess.run([toolchain.nvcc, "-cubin", "-arch=sm_90a", "-o", "probe.cubin", "probe.cu"], cwd=work,
                           capture_output=True, text=True, env=toolchain.environment(work), timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    return (work / "probe.cubin").read_bytes()


def cuobjdump_parameters(cubin: bytes, symbol: str) -> KernelParameters:
    """The same table as cuobjdump -elf prints it: the reference for the reader."""
    toolchain = find_toolchain()
    work = Path(tempfile.mkdtemp(prefix="kparams-"))
    (work / "k.cubin").write_bytes(cubin)
    text = run_tool([toolchain.cuobjdump, "-elf", "k.cubin"], env=toolchain.environment(work), cwd=work)
    section = re.split(rf"^\.nv\.info\.{symbol}$", text, flags=re.MULTILINE)[1].split("\n.nv.", 1)[0]
    found = {int(o, 16): (int(off, 16), int(size, 16)) for o, off, size in re.findall(
        r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)", section)}
    total = int(re.search(r"EIATTR_CBANK_PARAM_SIZE\s+Format:\s+\S+\s+Value:\s+(0x[0-9a-f]+)", section).group(1), 16)
    return KernelParameters(tuple(found[i][0] for i in sorted(found)), tuple(found[i][1] for i in sorted(found)),
                            total)


def test_the_cubin_places_a_tensor_map_at_a_64_byte_aligned_bank_address():
    cubin = probe_cubin()
    declared = read_kernel_parameters(cubin, "probe")
    assert declared == cuobjdump_parameters(cubin, "probe")
    # The parameter area starts at bank address 0x210 (16-byte aligned only): a CUtensorMap goes where
    # 0x210 + offset is a multiple of 64, 48 bytes in for the first one, not at the next multiple of 64.
    assert declared == KernelParameters((0, 48, 176, 184, 240, 368), (4, 128, 8, 8, 128, 4), 372)
    assert all((0x210 + o) % 64 == 0 for o, s in zip(declared.offsets, declared.sizes) if s == 128)
    args = [scalar(5), tmap("a"), buffer("b"), scalar(0.5, "f64"), tmap("c"), scalar(-2)]
    natural, _ = natural_layout(args)
    assert [s.offset for s in natural] == [0, 64, 192, 200, 256, 384]  # what a C struct would do: wrong here
    slots, total = parameter_layout(args, declared, "probe")
    assert [s.offset for s in slots] == [0, 48, 176, 184, 240, 368] and total == 372
    blob = pack_parameters(args, POINTERS, {1: b"\x11" * 128, 4: b"\x44" * 128}, declared, "probe")
    assert len(blob) == 372
    assert struct.unpack_from("<i", blob, 0)[0] == 5 and blob[4:48] == bytes(44)
    assert blob[48:176] == b"\x11" * 128 and blob[240:368] == b"\x44" * 128
    assert struct.unpack_from("<Qd", blob, 176) == (POINTERS["b"], 0.5)
    assert struct.unpack_from("<i", blob, 368)[0] == -2


def test_a_kernel_without_tensor_maps_declares_the_natural_layout():
    cubin = probe_cubin()
    declared = read_kernel_parameters(cubin, "plain")
    assert declared == cuobjdump_parameters(cubin, "plain") == KernelParameters((0, 8, 16, 24), (8, 8, 4, 8), 32)
    args = [buffer("a"), buffer("b"), scalar(3), scalar(4, "i64")]
    assert parameter_layout(args, declared) == natural_layout(args)
    assert pack_parameters(args, POINTERS, None, declared) == pycuda_style(args)


def test_a_table_that_does_not_match_the_plan():
    declared = read_kernel_parameters(probe_cubin(), "plain")
    fewer = [buffer("a"), buffer("b"), scalar(3)]
    assert parameter_layout(fewer, declared) == natural_layout(fewer)  # no tensor map: as before
    assert pack_parameters(fewer, POINTERS, None, declared) == pycuda_style(fewer)
    with pytest.raises(TensorMapError, match=r"the plan passes 2 arguments of \[128, 8\] bytes; plain declares "
                                             r"4 parameters of \[8, 8, 4, 8\] bytes"):
        parameter_layout([tmap(), buffer("b")], declared, "plain")
    with pytest.raises(TensorMapError, match="the cubin has no parameter table for probe"):
        parameter_layout([tmap()], None, "probe")


def test_unreadable_cubins_have_no_table():
    assert read_kernel_parameters(probe_cubin(), "missing") is None
    assert read_kernel_parameters(b"not an elf at all", "probe") is None
    assert read_kernel_parameters(probe_cubin()[:200], "probe") is None


def test_the_wgmma_expert_plan_packs_into_its_cubin_layout():
    from klineage.gate.compile import compile_kernel
    from klineage.kernel import load_kernel
    from klineage.launch import resolve

    state = load_kernel(Path(__file__).resolve().parents[1] / "corpus" / "kernels" / "gemm" / "wgmma_tma")
    compiled = compile_kernel(state, None)
    assert compiled.ok, compiled.log
    declared = read_kernel_parameters(compiled.cubin_bytes("sm_90a"), "gemm_bf16_wgmma_tma")
    assert declared == KernelParameters((48, 176, 304, 312, 316, 320), (128, 128, 8, 4, 4, 4), 324)
    (launch,) = resolve(state.plan, {"M": 1999, "N": 3001, "K": 2056, **state.constants}, {"x", "W", "y"})
    pointers = {"x": 0x7F00_0000_0000, "W": 0x7F00_1000_0000, "y": 0x7F00_2000_0000}
    blob = pack_parameters(launch.args, pointers, {0: b"\xaa" * 128, 1: b"\xbb" * 128}, declared)
    assert blob[:48] == bytes(48) and blob[48:176] == b"\xaa" * 128 and blob[176:304] == b"\xbb" * 128
    assert struct.unpack_from("<Qiii", blob, 304) == (pointers["y"], 1999, 3001, 2056) and len(blob) == 324


# ---------------------------------------------------------------------------------------------
# Tensor maps against their buffers
# ---------------------------------------------------------------------------------------------


def test_a_tensor_map_must_fit_its_buffer():
    check_tensor_map_buffer("x", MAP, 0x1000, 1000 * 512, "bfloat16")
    with pytest.raises(TensorMapError, match=r"declares dtype bf16 \(bfloat16\); the buffer holds float16"):
        check_tensor_map_buffer("x", MAP, 0x1000, 1000 * 512, "float16")
    with pytest.raises(TensorMapError, match="address is not 16-byte aligned"):
        check_tensor_map_buffer("x", MAP, 0x1008, 1000 * 512, "bfloat16")
    with pytest.raises(TensorMapError, match=r"spans 512000 bytes \(dims \[256, 1000\], strides \[512\]\); "
                                             r"the buffer has 511998"):
        check_tensor_map_buffer("x", MAP, 0x1000, 1000 * 512 - 2, "bfloat16")


def test_the_runner_still_imports_without_torch_or_pycuda():
    code = ("import sys, klineage.gate.runner, klineage.gate.params; "
            "print(sorted(m for m in ('torch', 'pycuda', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
