"""The wgmma + TMA GEMM expert on a real GPU (sm_90; skipped elsewhere).

Bottom up, so that a failure says which layer broke:
1. Parameter buffers: a probe kernel with 64-byte aligned CUtensorMap parameters between scalars
   and a pointer reads back exactly what the runner packed at the offsets its cubin declares, and
   the tensor maps arrive byte for byte as cuTensorMapEncodeTiled (called through ctypes) wrote them.
2. TMA: a probe kernel loads one 128B-swizzled box that overhangs the tensor; shared memory holds
   chunk c of row r at chunk position c ^ (r % 8), with zeros outside the tensor. This is the
   layout the expert's wgmma descriptors assume.
3. The gate: gemm/wgmma_tma passes every case it supports (seeds, guards, determinism), is timed
   against cuBLAS and gemm/mma_sync on the headline case, and is clean under memcheck and racecheck.
   The target is TARGET_VS_CUBLAS of cuBLAS's speed (run with -s to see the measured ratios).
"""

from __future__ import annotations

import ctypes
import struct

import pytest

from gpu_tools import (
    assert_clean_under_the_sanitizers,
    assert_passes_every_case,
    assert_reaches_target,
    gate_fixtures,
    probe_driver,
    timing_ratios,
)
from gpu_tools import launch_probe as launch
from klineage import corpus
from klineage.gate.params import TensorMapError, encode_tensor_map
from klineage.launch import TensorMap

pytestmark = pytest.mark.gpu
GEMM = corpus.problem_path("gemm")
EXPERT = "gemm/wgmma_tma"
BASELINE = "gemm/mma_sync"
TARGET_VS_CUBLAS = 0.95

PROBES = r"""
#include <cstdint>
struct alignas(64) TensorMap { unsigned long long opaque[16]; };

// Echo every parameter: two tensor maps sit between scalars, as in the layout test without a GPU.
extern "C" __global__ void echo(int a, const __grid_constant__ TensorMap m, unsigned long long* out, double d,
                                const __grid_constant__ TensorMap m2, int b)
{
    if (threadIdx.x != 0) return;
    out[0] = static_cast<unsigned int>(a);
    out[1] = static_cast<unsigned int>(b);
    out[2] = static_cast<unsigned long long>(__double_as_longlong(d));
    for (int i = 0; i < 16; ++i) {
        out[3 + i] = m.opaque[i];
        out[19 + i] = m2.opaque[i];
    }
}

// One TMA box (64 bf16 x 8 rows = 1024 bytes, 128B swizzle) at (c0, c1) into 1024-aligned shared
// memory, copied out verbatim.
extern "C" __global__ void tma_box(const __grid_constant__ TensorMap map, unsigned short* out, int c0, int c1)
{
    __shared__ __align__(128) unsigned char raw[2048];  // the box goes to its first 1024-aligned byte
    __shared__ __align__(8) unsigned long long bar;
    const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
    const uint32_t tile_addr = (raw_addr + 1023) & ~1023u;
    const unsigned short* tile = reinterpret_cast<const unsigned short*>(raw + (tile_addr - raw_addr));
    const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(bar_addr) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 1024;\n" :: "r"(bar_addr) : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1, {%2, %3}], [%4];\n"
                     :: "r"(tile_addr), "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(bar_addr)
                     : "memory");
    }
    __syncthreads();
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar_addr) : "memory");
    for (int i = threadIdx.x; i < 512; i += blockDim.x) out[i] = tile[i];
}
"""  # noqa: E501  (CUDA source, kept as written)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """torch's primary context shared with pycuda (as the runner does), and the probes' module."""
    with probe_driver(tmp_path_factory.mktemp("wgmma-probes"), PROBES) as loaded:
        yield loaded


def test_the_kernel_reads_the_parameter_buffer_as_packed(driver):
    drv, torch, module, cubin = driver
    src = torch.zeros(64, 64, dtype=torch.bfloat16, device="cuda")
    spec_a = TensorMap("bf16", (64, 64), (128,), (64, 8), "128B", "256B")
    spec_b = TensorMap("bf16", (64, 32), (128,), (32, 16), "64B", "128B")
    maps = {1: encode_tensor_map("src", spec_a, src.data_ptr()), 4: encode_tensor_map("src", spec_b, src.data_ptr())}
    assert maps[1] != maps[4] and any(maps[1])
    out = torch.zeros(35, dtype=torch.int64, device="cuda")
    args = (("scalar", -7, "i32"), ("tensor_map", "src", spec_a), ("buffer", "out", ""), ("scalar", 2.75, "f64"),
            ("tensor_map", "src", spec_b), ("scalar", 123456, "i32"))
    launch(drv, module, cubin, "echo", args, {"out": out.data_ptr(), "src": src.data_ptr()}, maps)
    got = struct.pack("<35q", *out.cpu().tolist())
    assert struct.unpack_from("<QQd", got, 0) == (2**32 - 7, 123456, 2.75)
    assert got[24:152] == maps[1] and got[152:280] == maps[4]


def test_the_driver_refuses_a_misaligned_tensor_map(driver):
    _, torch, _, _ = driver
    src = torch.zeros(64, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(TensorMapError, match=r"cuTensorMapEncodeTiled refused the map over 'src' \(CUDA_ERROR_"):
        encode_tensor_map("src", TensorMap("bf16", (64, 64), (128,), (64, 8), "128B", "256B"), src.data_ptr() + 2)


def test_tma_loads_a_swizzled_box_with_zeros_outside_the_tensor(driver):
    drv, torch, module, cubin = driver
    rows, cols = 10, 72  # K = 72: 144-byte rows, a multiple of 16
    values = torch.arange(1, rows * cols + 1, dtype=torch.int16, device="cuda").view(rows, cols)
    src = values.view(torch.bfloat16)
    spec = TensorMap("bf16", (cols, rows), (cols * 2,), (64, 8), "128B", "256B")
    tensor_map = encode_tensor_map("src", spec, src.data_ptr())
    out = torch.zeros(512, dtype=torch.int16, device="cuda")
    for c0, c1 in ((0, 0), (64, 4)):  # inside; overhanging columns 72.. and rows 10..
        out.zero_()
        args = (("tensor_map", "src", spec), ("buffer", "out", ""), ("scalar", c0, "i32"), ("scalar", c1, "i32"))
        launch(drv, module, cubin, "tma_box", args, {"src": src.data_ptr(), "out": out.data_ptr()}, {0: tensor_map})
        smem = out.cpu().view(8, 64)
        host = values.cpu()
        for r in range(8):
            for chunk in range(8):
                for e in range(8):
                    row, col = c1 + r, c0 + chunk * 8 + e
                    expected = int(host[row, col]) if row < rows and col < cols else 0
                    assert int(smem[r, (chunk ^ (r % 8)) * 8 + e]) == expected, (c0, c1, r, chunk, e)


# The full gate with timing against cuBLAS and the mma.sync expert (`timed`); sanitizers run separately.
cache, timed = gate_fixtures(GEMM, EXPERT, BASELINE)


def test_the_expert_passes_every_supported_case(timed):
    assert_passes_every_case(timed, {"headline", "ragged_mn", "skinny", "small"}, {"ragged", "odd_k"})


def test_the_expert_is_timed_against_cublas_and_mma_sync(timed):
    _, vs_mma = timing_ratios(timed, EXPERT, "cuBLAS", BASELINE, case=None)
    assert vs_mma > 1.0  # tensor-core MMA fed by TMA beats the mma.sync expert on the same tile


def test_the_expert_reaches_the_cublas_target(timed):
    assert_reaches_target(timed, TARGET_VS_CUBLAS)


def test_the_expert_is_clean_under_the_sanitizers(cache):
    assert_clean_under_the_sanitizers(GEMM, EXPERT, cache, ["small", "ragged_mn"])


def test_ctypes_finds_the_tensor_map_encoder():
    assert hasattr(ctypes.CDLL("libcuda.so.1"), "cuTensorMapEncodeTiled")
