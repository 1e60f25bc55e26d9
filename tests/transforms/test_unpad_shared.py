"""unpad_shared: a padded shared-memory row stride loses its padding; forward restores it. On the GEMM
and convolution epilogues the result compiles without spills, and a host build of the GEMM's own
epilogue (accumulators -> padded or unpadded staging tile -> output) writes the same output."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from cuda_tools import run_host_harness
from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.source import FILE_LOCUS
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.transforms import Anchor, Direction, NotApplicable, get
from tests.transforms.golden import HERE, check_golden, load

CASES = ["constant", "array"]


@pytest.fixture(scope="module")
def compile_cache(cache):
    """The transform tests' compile cache (tests/transforms/conftest.py: the run's compiles)."""
    return cache


@pytest.fixture(scope="module")
def unpad():
    return get("unpad_shared")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unpad_shared" / case, which, "kernel")


def plain(source: str) -> KernelState:
    return KernelState(source=source, plan=golden("constant", "before").plan)


def compiled(state: KernelState, cache_dir):
    result = compile_kernel(state, cache_dir)
    assert result.ok, result.log[-3000:]
    for launch in state.plan.launches:
        assert not result.resources_for(launch.entry).spills, launch.entry
    return result


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unpad_shared", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, compile_cache):
    for which in ("before", "after"):
        compiled(golden(case, which), compile_cache)


def test_anchors_and_carrier(unpad):
    constant = unpad.find(golden("constant", "before"))
    assert [(a.function, a.kind, a.key) for a in constant] == [
        (FILE_LOCUS, "declaration", 'STRIDE {"from":"TILE + PAD","to":"TILE"}')]
    array = unpad.find(golden("array", "before"))
    assert [(a.function, a.kind, a.key) for a in array] == [
        ("kernel", "declaration", 'tile[1] {"from":"TILE + 1","to":"TILE"}')]
    rewrite = unpad.backward(golden("constant", "before"), Anchor(FILE_LOCUS, "declaration", "STRIDE"))
    assert rewrite.carrier == {"padding": 1} and rewrite.removes == ()
    assert unpad.find(rewrite.state) == []
    restored = unpad.forward(rewrite.state, constant[0])
    assert restored.direction is Direction.FORWARD and restored.state.source == golden("constant", "before").source


LOOP_BOUND = """
constexpr int TILE = 32;
constexpr int STRIDE = TILE + 1;

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[TILE * STRIDE];
    for (int c = threadIdx.x; c < TILE * STRIDE; c += blockDim.x) tile[c] = 0.0f;
    __syncthreads();
    tile[threadIdx.x / TILE * STRIDE + threadIdx.x % TILE] = x[threadIdx.x];
    for (int c = 0; c < STRIDE; ++c) y[c] = tile[c];
}
"""

FLAT = """
constexpr int TILE = 32;

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[TILE][TILE + 1];
    float* flat = &tile[0][0];
    tile[threadIdx.x / TILE][threadIdx.x % TILE] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = flat[threadIdx.x % TILE * (TILE + 1) + threadIdx.x / TILE];
}
"""

GLOBAL_STRIDE = """
constexpr int TILE = 32;
constexpr int LD = TILE + 4;

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[TILE * LD];
    const int r = threadIdx.x / TILE, c = threadIdx.x % TILE;
    tile[r * LD + c] = x[r * LD + c];
    __syncthreads();
    y[r * TILE + c] = tile[c * LD + r];
}
"""


def test_not_applicable_cases(unpad):
    for source, anchor, reason in (
            (LOOP_BOUND, Anchor(FILE_LOCUS, "declaration", "STRIDE"),
             r"STRIDE is used other than as a row stride \(line 8: `for \(int c = threadIdx.x; c < TILE"),
            (FLAT, Anchor("kernel", "declaration", "tile[1]"), "tile is used as a flat pointer or row"),
            (GLOBAL_STRIDE, Anchor(FILE_LOCUS, "declaration", "LD"), r"LD is also a global-memory stride \(line 9\)")):
        state = plain(source)
        assert unpad.find(state) == []
        with pytest.raises(NotApplicable, match=reason):
            unpad.backward(state, anchor)
    with pytest.raises(NotApplicable, match="no padded shared-memory stride TILE"):
        unpad.backward(golden("constant", "before"), Anchor(FILE_LOCUS, "declaration", "TILE"))
    with pytest.raises(NotApplicable, match="is not the unpadded `TILE` any more"):
        unpad.forward(golden("constant", "before"), unpad.find(golden("constant", "before"))[0])


def test_a_less_aligned_unpadded_stride_is_refused(unpad):
    source = GLOBAL_STRIDE.replace("constexpr int LD = TILE + 4;", "constexpr int LD = 60 + PAD;").replace(
        "constexpr int TILE = 32;", "constexpr int TILE = 32;\nconstexpr int PAD = 4;").replace(
        "x[r * LD + c]", "x[r * TILE + c]")
    state = plain(source)
    assert unpad.find(state) == []
    with pytest.raises(NotApplicable, match="the unpadded stride 60 is less aligned than the padded 64"):
        unpad.backward(state, Anchor(FILE_LOCUS, "declaration", "LD"))


@pytest.mark.parametrize("name, constant, text", [("gemm/mma_sync", "EPI_STRIDE", "BLOCK_N + EPI_PAD"),
                                                  ("conv2d/implicit_gemm", "OUT_PITCH", "BLOCK_N + 8")])
def test_epilogue_staging_tiles(unpad, compile_cache, name, constant, text):
    expert = kernel_entry(name).load()
    anchors = unpad.find(expert)
    assert [(a.function, a.key.split(" ")[0]) for a in anchors] == [(FILE_LOCUS, constant)]
    rewrite = unpad.backward(expert, anchors[0])
    assert rewrite.carrier == {"padding": 8}
    assert f"constexpr int {constant} = BLOCK_N;" in rewrite.state.source
    assert rewrite.state.constants[constant] == expert.constants["BLOCK_N"]
    assert not cp.syntax_errors(rewrite.state.source)
    compiled(rewrite.state, compile_cache)  # its static_asserts (alignment, fit) hold unpadded too
    assert unpad.forward(rewrite.state, anchors[0]).state.source == expert.source
    assert text in expert.source


# A host build of the GEMM's own epilogue helpers: every thread's accumulators go to the staging tile
# (store_accumulators_to_shared), then the tile goes to y (store_tile_vectorized, store_tile_scalar).
# Each output element gets a distinct bf16 bit pattern, so a misplaced element cannot hide.
EPILOGUE = r"""
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
#define __cvta_generic_to_shared(p) ((size_t)0)
#include "kernel.cu"

alignas(16) static bf16 stage[BLOCK_M * EPI_STRIDE];
alignas(16) static bf16 y_vec[BLOCK_M * BLOCK_N];
alignas(16) static bf16 y_scalar[BLOCK_M * BLOCK_N];
static float acc[THREADS][WARP_TILES_M][WARP_TILES_N][4];

static unsigned bits_of(bf16 v)
{
    uint16_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

int main()
{
    for (int t = 0; t < THREADS; ++t) {
        const int warp = t / WARP_SIZE, lane = t % WARP_SIZE;
        for (int mt = 0; mt < WARP_TILES_M; ++mt)
            for (int nt = 0; nt < WARP_TILES_N; ++nt)
                for (int i = 0; i < 4; ++i) {
                    const int v = ((t * WARP_TILES_M + mt) * WARP_TILES_N + nt) * 4 + i;
                    const uint32_t bits = v < 16384 ? 0x0080u + v : 0x8080u + (v - 16384);
                    const uint32_t word = bits << 16;
                    memcpy(&acc[t][mt][nt][i], &word, sizeof word);
                    const int row = accumulator_row(warp / WARPS_N, mt, lane) + (i >= 2 ? ACC_ROW_HALF : 0);
                    const int col = accumulator_col(warp % WARPS_N, nt, lane) + (i & 1);
                    printf("a %d %d %u\n", row, col, bits);
                }
    }
    for (int t = 0; t < THREADS; ++t)
        store_accumulators_to_shared(stage, acc[t], t / WARP_SIZE / WARPS_N, t / WARP_SIZE % WARPS_N, t % WARP_SIZE);
    for (int t = 0; t < THREADS; ++t) {
        store_tile_vectorized(stage, y_vec, BLOCK_M, BLOCK_N, 0, 0, t);
        store_tile_scalar(stage, y_scalar, BLOCK_M, BLOCK_N, 0, 0, t);
    }
    for (int r = 0; r < BLOCK_M; ++r)
        for (int c = 0; c < BLOCK_N; ++c)
            printf("y %d %d %u %u\n", r, c, bits_of(y_vec[r * BLOCK_N + c]), bits_of(y_scalar[r * BLOCK_N + c]));
    printf("stride %d\n", EPI_STRIDE);
    return 0;
}
"""


def epilogue_tables(source: str, work) -> dict[str, list[list[int]]]:
    (work / "kernel.cu").write_text(source)
    (work / "harness.cu").write_text(EPILOGUE)
    return run_host_harness(work)


def test_gemm_epilogue_writes_the_same_output_padded_and_unpadded(unpad, tmp_path_factory):
    expert = kernel_entry("gemm/mma_sync").load()
    simpler = unpad.backward(expert, unpad.find(expert)[0]).state
    folders = [tmp_path_factory.mktemp(f"epilogue-{which}") for which in ("padded", "unpadded")]
    with ThreadPoolExecutor(2) as pool:
        padded, unpadded = pool.map(lambda pair: epilogue_tables(pair[0].source, pair[1]),
                                    zip((expert, simpler), folders))
    assert padded["stride"] == [[264]] and unpadded["stride"] == [[256]]
    expected = {(row, col): bits for row, col, bits in padded["a"]}
    assert len(expected) == 128 * 256 and len(set(expected.values())) == len(expected)
    for tables in (padded, unpadded):
        for row, col, vec_bits, scalar_bits in tables["y"]:
            assert vec_bits == scalar_bits == expected[(row, col)], (row, col)
    assert padded["y"] == unpadded["y"]
