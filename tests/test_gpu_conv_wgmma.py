"""conv2d/implicit_wgmma, the Hopper conv expert, on a real GPU (sm_90; skipped elsewhere).

Bottom up, so that a failure says which layer broke:
1. TMA halo boxes: a probe kernel loads one 4-D box (64 channels x 8 columns x 10 rows x 1 image,
   128B swizzle) of an NHWC tensor with C = 40, at negative coordinates and past the far edges, as
   the kernel does for the convolution's padding; shared memory holds exactly what the CPU tests'
   model (tests/test_corpus_conv_wgmma.py: tma_box_offset) says, zeros for every element outside
   the tensor, channels past C included. The kernel's wgmma descriptors and its zero padding both
   rest on this layout.
2. The gate: conv2d/implicit_wgmma passes every case it supports (seeds, guards, determinism) and is
   timed on the headline against cuDNN and the mma.sync expert conv2d/implicit_gemm (run with -s to
   see the measured ratios); it is clean under memcheck and racecheck.
3. The target, a test of its own: TARGET_VS_CUDNN of cuDNN's speed on the headline.
"""

from __future__ import annotations

import pytest

from gpu_tools import (
    assert_clean_under_the_sanitizers,
    assert_passes_every_case,
    assert_reaches_target,
    gate_fixtures,
    launch_probe,
    probe_driver,
    timing_ratios,
)
from klineage import corpus
from klineage.gate.params import encode_tensor_map
from klineage.launch import TensorMap
from test_corpus_conv_wgmma import SUPPORTED, tma_box_offset

pytestmark = pytest.mark.gpu
CONV = corpus.problem_path("conv2d")
EXPERT = "conv2d/implicit_wgmma"
BASELINE = "conv2d/implicit_gemm"
TARGET_VS_CUDNN = 1.2

PROBE = r"""
#include <cstdint>
struct alignas(64) TensorMap { unsigned long long opaque[16]; };

// One 4-D TMA box (64 fp16 x 8 x 10 x 1 = 10240 bytes, 128B swizzle) at (c0, c1, c2, c3) into
// 1024-aligned shared memory, copied out verbatim.
extern "C" __global__ void halo_box(const __grid_constant__ TensorMap map, unsigned short* out, int c0, int c1, int c2,
                                    int c3)
{
    constexpr int BOX_BYTES = 64 * 8 * 10 * 2;
    __shared__ __align__(128) unsigned char raw[BOX_BYTES + 1024];  // the box goes to its first 1024-aligned byte
    __shared__ __align__(8) unsigned long long bar;
    const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
    const uint32_t tile_addr = (raw_addr + 1023) & ~1023u;
    const unsigned short* tile = reinterpret_cast<const unsigned short*>(raw + (tile_addr - raw_addr));
    const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(bar_addr) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar_addr), "n"(BOX_BYTES)
                     : "memory");
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                     :: "r"(tile_addr), "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                        "r"(bar_addr)
                     : "memory");
    }
    __syncthreads();
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar_addr) : "memory");
    for (int i = threadIdx.x; i < BOX_BYTES / 2; i += blockDim.x) out[i] = tile[i];
}
"""  # noqa: E501  (CUDA source, kept as written)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """torch's primary context shared with pycuda (as the runner does), and the probe's module."""
    with probe_driver(tmp_path_factory.mktemp("conv-wgmma-probe"), PROBE) as loaded:
        yield loaded


@pytest.mark.parametrize("coords", [(0, -1, -1, 0), (0, -3, -2, 1), (0, 2, 1, 1), (0, 0, 0, 0)])
def test_tma_halo_box_with_padding_and_channels_past_c(driver, coords):
    drv, torch, module, cubin = driver
    n, h, w, c = 2, 5, 6, 40  # C = 40: a 64-channel box has 24 channels past C
    values = torch.arange(1, n * h * w * c + 1, dtype=torch.int16, device="cuda").view(n, h, w, c)
    spec = TensorMap("f16", (c, w, h, n), (2 * c, 2 * w * c, 2 * h * w * c), (64, 8, 10, 1), "128B", "256B")
    src = values.view(torch.float16)
    tensor_map = encode_tensor_map("x", spec, src.data_ptr())
    out = torch.full((64 * 8 * 10,), -1, dtype=torch.int16, device="cuda")
    args = (("tensor_map", "x", spec), ("buffer", "out", ""), *(("scalar", v, "i32") for v in coords))
    launch_probe(drv, module, cubin, "halo_box", args, {"x": src.data_ptr(), "out": out.data_ptr()}, {0: tensor_map})
    smem = out.cpu()
    host = values.cpu()
    c0, w0, h0, n0 = coords
    for row in range(10):
        for col in range(8):
            for ch in range(64):
                gh, gw, gc = h0 + row, w0 + col, c0 + ch
                inside = 0 <= gh < h and 0 <= gw < w and gc < c
                expected = int(host[n0, gh, gw, gc]) if inside else 0
                where = tma_box_offset((ch, col, row, 0), (64, 8, 10, 1)) // 2
                assert int(smem[where]) == expected, (coords, row, col, ch)


# The full gate with timing against cuDNN and the mma.sync expert (`timed`); sanitizers run separately.
cache, timed = gate_fixtures(CONV, EXPERT, BASELINE)


def test_the_expert_passes_every_supported_case(timed):
    assert_passes_every_case(timed, SUPPORTED, {"strided", "stem"})


def test_the_expert_is_timed_against_cudnn_and_implicit_gemm(timed):
    _, vs_mma = timing_ratios(timed, EXPERT, "cuDNN", BASELINE)
    assert vs_mma > 1.0  # wgmma on TMA halos beats the mma.sync im2col expert on the same problem


def test_the_expert_reaches_the_cudnn_target(timed):
    assert_reaches_target(timed, TARGET_VS_CUDNN)


def test_the_expert_is_clean_under_the_sanitizers(cache):
    assert_clean_under_the_sanitizers(CONV, EXPERT, cache, ["small", "odd_hw"])
