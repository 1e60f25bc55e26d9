"""fmha/flash_wgmma, the Hopper flash-attention expert, on a real GPU (sm_90; skipped elsewhere).

Bottom up, so that a failure says which layer broke. The probes are built from the expert's own
kernel.cu (its helpers, not copies), with small kernels of one warpgroup appended:
1. TMA: one box of the kernel's 3-D tensor map ([B*H][S][D], 64 columns x 128 rows, 128B swizzle)
   overhanging the end of a head: shared memory holds what the CPU tests' model says
   (tests/test_corpus_fmha_wgmma.py: tma_offset), zeros for the rows past S and nothing of the
   next head.
2. S = Q K^T through the expert's issue_scores (K-major descriptors for both operands, either
   consumer's 64 rows) on TMA-loaded tiles with a ragged key tail, read back through the
   accumulator layout: equal to the fp32 product.
3. O += P V through the expert's issue_pv (P packed to fp16 registers from the accumulator layout,
   V through the MN-major descriptor with the transpose-B bit): equal to the fp32 product.
4. The gate: fmha/flash_wgmma passes every case (seeds, guards, determinism), is timed on the
   headline against the vendor's fused attention and fmha/flash_mma (run with -s to see the ratios),
   and is clean under memcheck and racecheck.
5. The target, a test of its own: TARGET_VS_VENDOR of the vendor's speed on the headline.
"""

from __future__ import annotations

from pathlib import Path

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
from test_corpus_fmha_wgmma import tma_offset

pytestmark = pytest.mark.gpu
FMHA = corpus.problem_path("fmha")
EXPERT = "fmha/flash_wgmma"
BASELINE = "fmha/flash_mma"
TARGET_VS_VENDOR = 0.9
CASES = {"headline", "causal", "ragged", "ragged_causal", "small"}
KERNEL_CU = Path(__file__).resolve().parents[1] / "corpus" / "kernels" / "fmha" / "flash_wgmma" / "kernel.cu"

PROBES = r"""
// One warpgroup (128 threads) per probe; dynamic shared memory, its first 1024-aligned byte used.
__device__ __forceinline__ uint32_t aligned_base(unsigned char* raw)
{
    const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
    return (at + SMEM_ALIGN - 1) & ~static_cast<uint32_t>(SMEM_ALIGN - 1);
}

// Thread 0 initialises the barrier and announces `bytes`; the loads follow (load_tile); everyone
// waits for them with wait_tiles.
__device__ __forceinline__ void expect_tiles(uint32_t bar, int bytes)
{
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        mbar_arrive_expect_tx(bar, bytes);
    }
}

// A tile of rows 0.. of head 0 as the kernel loads it: one box per 64-column span of d.
__device__ __forceinline__ void load_tile(uint32_t bar, const TensorMap* map, uint32_t tile, int span_bytes)
{
    if (threadIdx.x == 0)
        for (int h = 0; h < D_SPANS; ++h) tma_load_3d(tile + h * span_bytes, map, bar, h * SPAN, 0, 0);
}

__device__ __forceinline__ void wait_tiles(uint32_t bar)
{
    __syncthreads();
    mbar_wait(bar, 0);
}

// One box (64 columns from d0, BLOCK_N rows from `row` of head `head`), copied out verbatim.
extern "C" __global__ void tma_head_box(const __grid_constant__ TensorMap map, unsigned short* out, int d0, int row,
                                        int head)
{
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) unsigned long long bar;
    const uint32_t tile = aligned_base(raw);
    const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    expect_tiles(b, KV_SPAN_BYTES);
    if (threadIdx.x == 0) tma_load_3d(tile, &map, b, d0, row, head);
    wait_tiles(b);
    const unsigned short* smem = reinterpret_cast<const unsigned short*>(raw + (tile - static_cast<uint32_t>(
        __cvta_generic_to_shared(raw))));
    for (int i = threadIdx.x; i < KV_SPAN_BYTES / 2; i += blockDim.x) out[i] = smem[i];
}

// S = Q K^T for one consumer's 64 rows: Q and K tiles loaded as the kernel loads them, issue_scores,
// accumulators written to s_out[row][key] through the accumulator layout.
extern "C" __global__ void qk_probe(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                                    float* s_out, int consumer)
{
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) unsigned long long bar;
    const uint32_t q_tile = aligned_base(raw);
    const uint32_t k_tile = q_tile + Q_TILE_BYTES;
    const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    expect_tiles(b, Q_TILE_BYTES + KV_TILE_BYTES);
    load_tile(b, &map_q, q_tile, Q_SPAN_BYTES);
    load_tile(b, &map_k, k_tile, KV_SPAN_BYTES);
    wait_tiles(b);
    float s[S_REGS];
    for (int i = 0; i < S_REGS; ++i) s[i] = 0.0f;
    issue_scores(s, q_tile, consumer, k_tile);
    wgmma_wait<0>();
    fence_registers(s);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    for (int i = 0; i < S_REGS; ++i) s_out[accumulator_row(warp, lane, i) * S_N + accumulator_col(lane, i)] = s[i];
}

// O = P V: P (64 x BLOCK_N fp16, row-major in global) taken into the score accumulator layout and
// packed by pack_p, V loaded as the kernel loads it, issue_pv, accumulators to o_out[row][d].
extern "C" __global__ void pv_probe(const __grid_constant__ TensorMap map_v, const __half* p_in, float* o_out)
{
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) unsigned long long bar;
    const uint32_t v_tile = aligned_base(raw);
    const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
    expect_tiles(b, KV_TILE_BYTES);
    load_tile(b, &map_v, v_tile, KV_SPAN_BYTES);
    wait_tiles(b);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    float s[S_REGS];
    for (int i = 0; i < S_REGS; ++i) s[i] = __half2float(p_in[accumulator_row(warp, lane, i) * S_N + accumulator_col(lane, i)]);
    uint32_t p[P_REGS];
    pack_p(p, s);
    float o[O_REGS];
    for (int i = 0; i < O_REGS; ++i) o[i] = 0.0f;
    issue_pv(o, p, v_tile);
    wgmma_wait<0>();
    fence_registers(o);
    for (int i = 0; i < O_REGS; ++i) o_out[accumulator_row(warp, lane, i) * O_N + accumulator_col(lane, i)] = o[i];
}
"""  # noqa: E501  (CUDA source, kept as written)
PROBE_SHARED = 1024 + 32 * 1024 + 32 * 1024  # alignment slack, a Q tile and a K tile
PROBE_FLAGS = ("-O3", "--ftz=true")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """torch's primary context shared with pycuda (as the runner does), and the probes' module."""
    with probe_driver(tmp_path_factory.mktemp("fmha-wgmma-probes"), KERNEL_CU.read_text() + PROBES, *PROBE_FLAGS
                      ) as (drv, torch, module, cubin):
        for name in ("tma_head_box", "qk_probe", "pv_probe"):
            module.get_function(name).set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    PROBE_SHARED)
        yield drv, torch, module, cubin


def launch(drv, module, cubin: bytes, name: str, args, pointers, maps) -> None:
    launch_probe(drv, module, cubin, name, args, pointers, maps, shared=PROBE_SHARED)


def head_map(s_len: int, heads: int, rows: int) -> TensorMap:
    """The launch plan's map over a [heads][s_len][128] fp16 tensor (see launch.toml)."""
    return TensorMap("f16", (128, s_len, heads), (256, 256 * s_len), (64, rows, 1), "128B", "256B")


@pytest.mark.parametrize("d0, row, head", [(0, 0, 0), (64, 40, 1), (64, 100, 0)])
def test_tma_box_of_a_head_with_zeros_past_s(driver, d0, row, head):
    drv, torch, module, cubin = driver
    heads, s_len = 2, 150
    values = torch.arange(1, heads * s_len * 128 + 1, dtype=torch.int32).remainder(30000).to(torch.int16)
    values = values.view(heads, s_len, 128).cuda()
    src = values.view(torch.float16)
    spec = head_map(s_len, heads, 128)
    out = torch.full((64 * 128,), -1, dtype=torch.int16, device="cuda")
    args = (("tensor_map", "q", spec), ("buffer", "out", ""), ("scalar", d0, "i32"), ("scalar", row, "i32"),
            ("scalar", head, "i32"))
    launch(drv, module, cubin, "tma_head_box", args, {"q": src.data_ptr(), "out": out.data_ptr()},
           {0: encode_tensor_map("q", spec, src.data_ptr())})
    smem = out.cpu()
    host = values.cpu()
    for r in range(128):
        for col in range(64):
            expected = int(host[head, row + r, d0 + col]) if row + r < s_len else 0  # never the next head's rows
            assert int(smem[tma_offset(r, col) // 2]) == expected, (r, col)


@pytest.mark.parametrize("consumer", [0, 1])
def test_scores_through_the_expert_helpers(driver, consumer):
    drv, torch, module, cubin = driver
    gen = torch.Generator().manual_seed(11 + consumer)
    s_len = 100  # keys 100.. of the tile are TMA zero fill: their scores are 0
    q = torch.randn(1, 128, 128, generator=gen).half().cuda()
    k = torch.randn(1, s_len, 128, generator=gen).half().cuda()
    q_spec, k_spec = head_map(128, 1, 128), head_map(s_len, 1, 128)
    out = torch.full((64, 128), float("nan"), device="cuda")
    args = (("tensor_map", "q", q_spec), ("tensor_map", "k", k_spec), ("buffer", "out", ""),
            ("scalar", consumer, "i32"))
    launch(drv, module, cubin, "qk_probe", args, {"q": q.data_ptr(), "k": k.data_ptr(), "out": out.data_ptr()},
           {0: encode_tensor_map("q", q_spec, q.data_ptr()), 1: encode_tensor_map("k", k_spec, k.data_ptr())})
    want = torch.zeros(64, 128)
    want[:, :s_len] = q[0, 64 * consumer:64 * consumer + 64].float().cpu() @ k[0].float().cpu().T
    torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-3)


def test_p_v_through_the_expert_helpers(driver):
    drv, torch, module, cubin = driver
    gen = torch.Generator().manual_seed(3)
    p = torch.rand(64, 128, generator=gen).half().cuda()
    v = torch.randn(1, 128, 128, generator=gen).half().cuda()
    v_spec = head_map(128, 1, 128)
    out = torch.full((64, 128), float("nan"), device="cuda")
    args = (("tensor_map", "v", v_spec), ("buffer", "p", ""), ("buffer", "out", ""))
    launch(drv, module, cubin, "pv_probe", args, {"v": v.data_ptr(), "p": p.data_ptr(), "out": out.data_ptr()},
           {0: encode_tensor_map("v", v_spec, v.data_ptr())})
    want = p.float().cpu() @ v[0].float().cpu()
    torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-3)


# The full gate with timing against the vendor and the mma.sync expert (`timed`); sanitizers run separately.
cache, timed = gate_fixtures(FMHA, EXPERT, BASELINE)


def test_the_expert_passes_every_case(timed):
    assert_passes_every_case(timed, CASES)


def test_the_expert_is_timed_against_the_vendor_and_flash_mma(timed):
    _, vs_mma = timing_ratios(timed, EXPERT, "the vendor's SDPA", BASELINE)
    assert vs_mma > 1.0  # wgmma fed by TMA beats the mma.sync expert on the same tiles


def test_the_expert_reaches_the_vendor_target(timed):
    assert_reaches_target(timed, TARGET_VS_VENDOR)


def test_the_expert_is_clean_under_the_sanitizers(cache):
    assert_clean_under_the_sanitizers(FMHA, EXPERT, cache, ["small", "ragged_causal"])
