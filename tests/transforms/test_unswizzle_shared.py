"""unswizzle_shared: the XOR swizzle of a shared-memory layout becomes the identity at every site of
its family; forward restores it. On the mma.sync GEMM and the implicit-GEMM convolution the result
compiles without spills, and a host build of the kernels' own address helpers (before and after)
shows both layouts are bijections on which every writer and reader still meet."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import pytest

from cuda_tools import run_host_harness
from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.transforms import Anchor, Direction, NotApplicable, get
from tests.sampled import sampled
from tests.transforms.golden import HERE, check_golden, load

CASES = ["helper", "inline", "family"]


@pytest.fixture(scope="module")
def compile_cache(cache):
    """The transform tests' compile cache (tests/transforms/conftest.py: the run's compiles)."""
    return cache


@pytest.fixture(scope="module")
def unswizzle():
    return get("unswizzle_shared")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unswizzle_shared" / case, which, "kernel")


def sites(anchor: Anchor) -> list[dict]:
    return json.loads(anchor.key.split(" ", 1)[1])["sites"]


def compiled(state: KernelState, cache_dir):
    result = compile_kernel(state, cache_dir)
    assert result.ok, result.log[-3000:]
    for launch in state.plan.launches:
        assert not result.resources_for(launch.entry).spills, launch.entry
    return result


# ------------------------------------------------------------------------------------------------
# Goldens
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unswizzle_shared", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('family',)))
def test_golden_kernels_compile(case, compile_cache):
    for which in ("before", "after"):
        compiled(golden(case, which), compile_cache)


def test_helper_anchor_and_carrier(unswizzle):
    anchors = unswizzle.find(golden("helper", "before"))
    assert [(a.function, a.kind, a.key.split(" ")[0]) for a in anchors] == [("swizzle", "function", "swizzle")]
    assert sites(anchors[0]) == [{"fn": "swizzle", "from": "(chunk ^ (row & 7))", "to": "chunk", "at": 1}]
    rewrite = unswizzle.backward(golden("helper", "before"), anchors[0])
    assert rewrite.carrier == {"sites": 1, "swizzle_period": 8}
    assert unswizzle.find(rewrite.state) == []


def test_family_spans_the_writer_and_the_reader_helper(unswizzle):
    anchors = unswizzle.find(golden("family", "before"))
    assert len(anchors) == 1
    assert anchors[0].function == "swizzle_offset"  # the helper whose phase comes from its own row
    assert [(s["fn"], s["from"]) for s in sites(anchors[0])] == [
        ("swizzle_offset", "(chunk ^ (row % SWIZZLE_ROWS))"), ("read_offset", "(chunk ^ la.phase)")]


def test_inline_family_removes_the_source_feature(unswizzle):
    before = golden("inline", "before")
    assert Feature("kernel", "xor_swizzle") in source_features(before.source)
    anchor = unswizzle.find(before)[0]
    assert (anchor.function, anchor.kind, anchor.key.split(" ")[0]) == ("kernel", "subscript", "tile")
    rewrite = unswizzle.backward(before, anchor)
    assert rewrite.removes == ("xor_swizzle",)
    assert Feature("kernel", "xor_swizzle") not in source_features(rewrite.state.source)
    restored = unswizzle.forward(rewrite.state, anchor)
    assert restored.direction is Direction.FORWARD and restored.adds == ("xor_swizzle",)


# ------------------------------------------------------------------------------------------------
# Not applicable
# ------------------------------------------------------------------------------------------------

BITONIC = """
__global__ void kernel(float* __restrict__ data)
{
    __shared__ float buf[256];
    const int i = threadIdx.x;
    buf[i] = data[i];
    __syncthreads();
    for (int j = 128; j > 0; j >>= 1) {
        const int partner = i ^ j;
        if (partner > i && buf[i] > buf[partner]) {
            const float t = buf[i];
            buf[i] = buf[partner];
            buf[partner] = t;
        }
        __syncthreads();
    }
    data[i] = buf[i];
}
"""

GLOBAL_USE = """
__device__ __forceinline__ int swizzle(int row, int chunk) { return row * 8 + (chunk ^ (row & 7)); }

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[64];
    tile[swizzle(threadIdx.x / 8, threadIdx.x % 8)] = x[threadIdx.x];
    __syncthreads();
    y[swizzle(threadIdx.x % 8, threadIdx.x / 8)] = tile[threadIdx.x];
}
"""


def plain(source: str) -> KernelState:
    return KernelState(source=source, plan=golden("helper", "before").plan)


def test_an_algorithmic_xor_is_not_a_swizzle(unswizzle):
    state = plain(BITONIC)
    # `i ^ j` has no row phase: a butterfly, not a layout, for the feature reader and the transform alike.
    assert Feature("kernel", "xor_swizzle") not in source_features(state.source)
    assert unswizzle.find(state) == []
    with pytest.raises(NotApplicable, match="no XOR swizzle of shared memory named partner"):
        unswizzle.backward(state, Anchor("kernel", "subscript", "partner"))


def test_a_helper_that_also_addresses_global_memory_is_refused(unswizzle):
    state = plain(GLOBAL_USE)
    assert unswizzle.find(state) == []
    with pytest.raises(NotApplicable, match=r"swizzle\(\) also addresses global memory \(y, line 9\)"):
        unswizzle.backward(state, Anchor("swizzle", "function", "swizzle"))


def test_forward_needs_the_recorded_sites(unswizzle):
    after = golden("helper", "after")
    with pytest.raises(NotApplicable, match="does not record the swizzle sites"):
        unswizzle.forward(after, Anchor("swizzle", "function", "swizzle"))
    anchor = unswizzle.find(golden("helper", "before"))[0]
    edited = plain(after.source.replace("return row * ROW_BYTES + (chunk << 4);", "return row * ROW_BYTES;"))
    with pytest.raises(NotApplicable, match=r"the unswizzled index `chunk` #1 is not in swizzle"):
        unswizzle.forward(edited, anchor)


# ------------------------------------------------------------------------------------------------
# The corpus experts
# ------------------------------------------------------------------------------------------------

EXPERTS = {"gemm/mma_sync": ("swizzle_offset", ["swizzle_offset", "a_fragment_offset", "b_fragment_offset"]),
           "conv2d/implicit_gemm": ("swizzle", ["swizzle"])}


@cache
def unswizzled(name: str) -> tuple[KernelState, KernelState, Anchor]:
    transform = get("unswizzle_shared")
    expert = kernel_entry(name).load()
    anchors = transform.find(expert)
    assert len(anchors) == 1
    return expert, transform.backward(expert, anchors[0]).state, anchors[0]


@pytest.mark.parametrize("name", EXPERTS)
def test_forward_refuses_a_site_that_is_swizzled_already(unswizzle, name):
    """Two anchors may name one site (another walk's helper of the same name and body): XORing the
    index twice would leave no swizzle at all, so the second forward does not apply."""
    _, plain_state, anchor = unswizzled(name)
    restored = unswizzle.forward(plain_state, anchor).state
    with pytest.raises(NotApplicable, match="swizzled already"):
        unswizzle.forward(restored, anchor)


@pytest.mark.parametrize("name", EXPERTS)
def test_expert_family_is_found_and_removed(unswizzle, compile_cache, name):
    expert, plain_state, anchor = unswizzled(name)
    helper, functions = EXPERTS[name]
    assert anchor.function == helper and [s["fn"] for s in sites(anchor)] == functions
    assert not cp.syntax_errors(plain_state.source)
    # No XOR is left in any function of the family, and the transform finds no swizzle left.
    for function in cp.functions(plain_state.source):
        if function.name in functions:
            assert "^" not in cp.parse(plain_state.source).text(function.node)
    assert unswizzle.find(plain_state) == []
    assert unswizzle.forward(plain_state, anchor).state.source == expert.source
    before = sass_features(compiled(expert, compile_cache).cubin_bytes())
    after = sass_features(compiled(plain_state, compile_cache).cubin_bytes())
    entry = expert.plan.launches[0].entry
    for name_ in ("ldsm", "hmma", "ldgsts"):  # the other mechanisms are untouched
        assert after.count(name_, entry) == before.count(name_, entry) > 0


# A host build of the kernel's own helpers. The kernel file is included as it is; its __device__
# helpers become host-callable, and the device-only pieces the host never calls are stubbed out.
HARNESS_PRELUDE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdint>
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
#define __cvta_generic_to_shared(p) ((size_t)0)
#define __cvta_generic_to_global(p) (p)
#define __ldg(p) (*(p))
#include "kernel.cu"
"""

GEMM_MAIN = r"""
static bf16 xs[1 << 20], ws[1 << 20];

int main()
{
    const int M = 4096, N = 4096, K = 256;
    for (int tid = 0; tid < THREADS; ++tid) {
        const TileLoader ld = make_tile_loader(xs, ws, M, N, K, 0, 0, tid);
        for (int i = 0; i < A_LOADS; ++i)
            printf("wa %d %d %lld %u\n", tid, i, (long long)(ld.a_src - xs) + i * ld.row_step,
                   pass_offset(ld.smem_offset, i));
        for (int i = 0; i < B_LOADS; ++i)
            printf("wb %d %d %lld %u\n", tid, i, (long long)(ld.b_src - ws) + i * ld.row_step,
                   pass_offset(ld.smem_offset, i));
    }
    for (int warp = 0; warp < THREADS / WARP_SIZE; ++warp)
        for (int lane = 0; lane < WARP_SIZE; ++lane) {
            const FragmentAddressing fa = make_fragment_addressing(warp / WARPS_N, warp % WARPS_N, lane);
            for (int ks = 0; ks < K_STEPS; ++ks) {
                for (int mt = 0; mt < WARP_TILES_M; ++mt)
                    printf("ra %d %d %d %d %u\n", warp, lane, ks, mt, a_fragment_offset(fa, ks, mt));
                for (int np = 0; np < WARP_TILES_N / 2; ++np)
                    printf("rb %d %d %d %d %u\n", warp, lane, ks, np, b_fragment_offset(fa, ks, np));
            }
        }
    printf("k %d\n", K);
    return 0;
}
"""

CONV_MAIN = r"""
int main()
{
    for (int row = 0; row < (BLOCK_M > BLOCK_N ? BLOCK_M : BLOCK_N); ++row)
        for (int chunk = 0; chunk < CHUNKS_PER_ROW; ++chunk) printf("s %d %d %u\n", row, chunk, swizzle(row, chunk));
    return 0;
}
"""


def host_tables(source: str, main: str, work) -> dict[str, list[list[int]]]:
    (work / "kernel.cu").write_text(source)
    (work / "harness.cu").write_text(HARNESS_PRELUDE + main)
    return run_host_harness(work)


def both_tables(name: str, main: str, tmp_path_factory) -> tuple[dict, dict]:
    expert, plain_state, _ = unswizzled(name)
    folders = [tmp_path_factory.mktemp(f"harness-{which}") for which in ("before", "after")]
    with ThreadPoolExecutor(2) as pool:
        return tuple(pool.map(lambda pair: host_tables(pair[0].source, main, pair[1]),
                              zip((expert, plain_state), folders)))


def gemm_layout_check(tables: dict, constants: dict) -> set[tuple]:
    """Writers: global element (row, chunk) of a tile -> shared byte offset, from the loader's own
    source pointers. Readers: the (row, chunk) an ldmatrix lane must address for mma.m16n8k16 (the
    PTX fragment layout) -> the helper's offset. Returns the (writer, reader) pairs that meet."""
    K = tables["k"][0][0]
    vec, rows_a, rows_b = constants["VEC"], constants["BLOCK_M"], constants["BLOCK_N"]
    pairs = set()
    for tile, rows, reader in (("wa", rows_a, "ra"), ("wb", rows_b, "rb")):
        writer: dict[tuple[int, int], int] = {}
        who: dict[tuple[int, int], tuple] = {}
        for tid, i, element, offset in tables[tile]:
            logical = (element // K, (element % K) // vec)
            assert logical not in writer, (tile, logical)
            writer[logical], who[logical] = offset, (tile, tid, i)
        # A bijection of the tile's (row, chunk) onto its 16-byte slots.
        assert set(writer) == {(r, c) for r in range(rows) for c in range(constants["CHUNKS_PER_ROW"])}
        assert sorted(writer.values()) == [16 * s for s in range(rows * constants["CHUNKS_PER_ROW"])]
        for warp, lane, ks, t, offset in tables[reader]:
            warp_m, warp_n = warp // constants["WARPS_N"], warp % constants["WARPS_N"]
            if reader == "ra":
                logical = (warp_m * constants["WARP_M"] + t * 16 + lane % 16, 2 * ks + lane // 16)
            else:
                row = warp_n * constants["WARP_N"] + t * 16 + lane % 8 + 8 * (lane // 16)
                logical = (row, 2 * ks + (lane // 8) % 2)
            assert writer[logical] == offset, (reader, warp, lane, ks, t)
            pairs.add((who[logical], (reader, warp, lane, ks, t)))
    return pairs


def test_gemm_layouts_before_and_after_are_bijections_on_which_writers_and_readers_meet(tmp_path_factory):
    before, after = both_tables("gemm/mma_sync", GEMM_MAIN, tmp_path_factory)
    constants = kernel_entry("gemm/mma_sync").load().constants
    pairs_before = gemm_layout_check(before, constants)
    pairs_after = gemm_layout_check(after, constants)
    assert pairs_before == pairs_after and len(pairs_before) > 0
    # The layouts do differ: the expert's is swizzled, the simplified one is the identity.
    moved = [w for w, v in zip(before["wa"], after["wa"]) if w[3] != v[3]]
    assert moved and all(v[3] == (v[2] // before["k"][0][0]) * 128 + (v[2] % before["k"][0][0]) // 8 * 16
                         for v in after["wa"])


def test_conv_swizzle_helper_before_and_after_is_a_bijection_per_row(tmp_path_factory):
    before, after = both_tables("conv2d/implicit_gemm", CONV_MAIN, tmp_path_factory)
    row_bytes = kernel_entry("conv2d/implicit_gemm").load().constants["ROW_BYTES"]
    for table, identity in ((before, False), (after, True)):
        slots = {}
        for row, chunk, offset in table["s"]:
            assert row * row_bytes <= offset < (row + 1) * row_bytes and offset % 16 == 0  # stays in its row
            slots[(row, chunk)] = offset
            assert (offset == row * row_bytes + 16 * chunk) == (identity or (row & 7) == 0)
        assert len(set(slots.values())) == len(slots)  # injective, hence a bijection of each row's slots
    # Every call site passes the same (row, chunk) for writing and reading a logical chunk (cp.async in
    # load_stage, ldmatrix in load_a_fragment and load_b_fragments), so a bijective helper on both
    # sides keeps every copy and ldmatrix meeting; and no XOR is left anywhere in the kernel.
    parsed = cp.parse(unswizzled("conv2d/implicit_gemm")[1].source)
    calls = [cp.function_of(c) for c in cp.nodes_of_type(parsed.root, "call_expression")
             if cp.call_name(c) == "swizzle"]
    assert sorted(calls) == ["load_a_fragment", "load_b_fragments", "load_stage", "load_stage"]
    assert not [n for n in cp.nodes_of_type(parsed.root, "binary_expression") if parsed.text(n).count("^")]


def test_the_layout_model_rejects_half_an_unswizzle(tmp_path_factory):
    """Dropping the XOR only where the tiles are written (not in the ldmatrix helpers) breaks the
    kernel: this is why the whole family goes in one step."""
    expert = kernel_entry("gemm/mma_sync").load()
    writer_only = expert.source.replace("((chunk ^ (row % SWIZZLE_ROWS)) * CHUNK_BYTES)", "(chunk * CHUNK_BYTES)")
    assert writer_only != expert.source
    tables = host_tables(writer_only, GEMM_MAIN, tmp_path_factory.mktemp("harness-writer-only"))
    with pytest.raises(AssertionError):
        gemm_layout_check(tables, expert.constants)
