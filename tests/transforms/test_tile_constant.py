"""tile_constant: carrier tuning, one tile/vector/warp/thread/stage constant set to a new value."""

from __future__ import annotations

import pytest

from klineage import devices
from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.launch import resolve
from klineage.transforms import Anchor, NotApplicable, Role, get
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["declaration", "macro"]


@pytest.fixture(scope="module")
def tile():
    return get("tile_constant")


def golden(case: str, which: str):
    return load(HERE / "tile_constant" / case, which, "kernel")


def anchor(key: str, kind: str = "declaration") -> Anchor:
    return Anchor("<file>", kind, key)


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("tile_constant", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_is_carrier_tuning_with_old_and_new_values(tile):
    assert tile.role is Role.CARRIER and tile.describe()["role"] == "carrier"
    before = golden("declaration", "before")
    assert tile.find(before) == [anchor("ROWS_PER_BLOCK:8->4"), anchor("THREADS:128->64")]
    rewrite = tile.backward(before, anchor("ROWS_PER_BLOCK:8->4"))
    assert rewrite.carrier == {"constant": "ROWS_PER_BLOCK", "old": 8, "new": 4}
    assert rewrite.removes == () and rewrite.adds == ()
    # The plan is unchanged: it names the constant, and the new value comes from the source.
    assert rewrite.state.plan == before.plan
    env = {"rows": 100, "cols": 10}
    (old,) = resolve(before.plan, {**env, **before.constants}, {"x", "y"})
    (new,) = resolve(rewrite.state.plan, {**env, **rewrite.state.constants}, {"x", "y"})
    assert (old.grid, new.grid) == ((13, 1, 1), (25, 1, 1))


def test_other_key_forms(tile):
    before = golden("declaration", "before")
    assert tile.backward(before, anchor("THREADS")).carrier == {"constant": "THREADS", "old": 128, "new": 64}
    set_to = tile.backward(before, anchor("THREADS=96"))
    assert "constexpr int THREADS = 96;" in set_to.state.source
    doubled = tile.forward(before, anchor("ROWS_PER_BLOCK"))
    assert "constexpr int ROWS_PER_BLOCK = 16;  // rows per block" in doubled.state.source
    with pytest.raises(NotApplicable, match="records no old value of THREADS"):
        tile.forward(set_to.state, anchor("THREADS=96"))


def test_stage_and_vector_counts_go_to_one(tile):
    source = ("constexpr int STAGES = 3;\nconstexpr int VEC_WIDTH = 4;\nconstexpr int GROUP_M = 7;\n"
              "constexpr int WARP_SIZE = 32;\nconstexpr int BLOCK_M = 2 * 64;\n"
              "__global__ void kernel(float* y) { y[threadIdx.x] = STAGES * VEC_WIDTH * GROUP_M * BLOCK_M; }\n")
    state = golden("declaration", "before").with_source(source)
    # GROUP_M = 7 has no half; WARP_SIZE is no tuning knob; BLOCK_M is derived (change what it derives from).
    assert [a.key for a in tile.find(state)] == ["STAGES:3->1", "VEC_WIDTH:4->1"]


def test_static_asserts_divisions_and_vector_widths_are_checked(tile):
    gemm = kernel_entry("gemm/mma_sync").load()
    with pytest.raises(NotApplicable, match=r"STAGES = 1 breaks static_assert\(.*\)"):
        tile.backward(gemm, anchor("STAGES:4->1"))
    with pytest.raises(NotApplicable, match='BLOCK_K = 32 breaks static_assert.*"the XOR swizzle assumes 8 chunks'):
        tile.backward(gemm, anchor("BLOCK_K:64->32"))
    conv = kernel_entry("conv2d/implicit_gemm").load()
    with pytest.raises(NotApplicable, match="BLOCK_M = 96 breaks static_assert"):
        tile.backward(conv, anchor("BLOCK_M:192->96"))
    topk = kernel_entry("topk/radix_select").load()
    with pytest.raises(NotApplicable, match="VEC is the width of the uint4 accesses in for_each_key"):
        tile.backward(topk, anchor("VEC:4->1"))
    source = ("constexpr int BLOCK_M = 96;\nconstexpr int ROWS = BLOCK_M / 32;\n"
              "__global__ void kernel(float* y) { y[threadIdx.x] = ROWS; }\n")
    state = gemm.with_source(source)
    with pytest.raises(NotApplicable, match=r"makes ROWS's `BLOCK_M / 32` inexact \(48 / 32\)"):
        tile.backward(state, anchor("BLOCK_M:96->48"))


def test_not_applicable_cases(tile):
    before = golden("declaration", "before")
    with pytest.raises(NotApplicable, match="ROWS_PER_BLOCK is 8 here, not 16"):
        tile.backward(before, anchor("ROWS_PER_BLOCK:16->8"))
    with pytest.raises(NotApplicable, match="no tuning constant BLOCK_Q"):
        tile.backward(before, anchor("BLOCK_Q:8->4"))
    with pytest.raises(NotApplicable, match="ROWS_PER_BLOCK is 8 here, not 4"):
        tile.forward(before, anchor("ROWS_PER_BLOCK:8->4"))
    with pytest.raises(NotApplicable, match="must stay positive"):
        tile.backward(before, anchor("THREADS=0"))
    with pytest.raises(NotApplicable, match="needs a declaration anchor"):
        tile.backward(before, Anchor("kernel", "loop", "THREADS"))
    odd = before.with_source(before.source.replace("ROWS_PER_BLOCK = 8;", "ROWS_PER_BLOCK = 3;"))
    assert [a.key for a in tile.find(odd)] == ["THREADS:128->64"]
    with pytest.raises(NotApplicable, match="ROWS_PER_BLOCK = 3 has no smaller step"):
        tile.backward(odd, anchor("ROWS_PER_BLOCK"))


@pytest.mark.parametrize("name, key, derived", [
    ("gemm/mma_sync", "BLOCK_M:128->64", {"WARP_TILES_M": 2, "A_LOADS": 2}),
    ("gemm/mma_sync", "GROUP_M:8->4", {}),
    ("row_softmax/warp_vec4", "THREADS:256->128", {"WARPS": 4}),
    ("conv2d/implicit_gemm", "BLOCK_N:128->64", {"N_FRAGS": 4, "B_PASSES": 2}),
    ("topk/radix_select", "THREADS:1024->512", {"WARPS": 16}),
])
def test_expert_constants_change_and_compile_without_spills(name, key, derived, tile, cache):
    state = kernel_entry(name).load()
    site = anchor(key)
    assert site in tile.find(state)
    rewrite = tile.backward(state, site)
    assert not cp.syntax_errors(rewrite.state.source)
    constant, values = key.split(":")
    assert rewrite.state.constants[constant] == int(values.split("->")[1])
    for derived_name, value in derived.items():
        assert rewrite.state.constants[derived_name] == value
    assert tile.forward(rewrite.state, site).state.source == state.source
    compiles_without_spills(rewrite.state, cache)


def test_smaller_gemm_tile_launches_more_blocks_with_less_shared_memory(tile):
    state = kernel_entry("gemm/mma_sync").load()
    rewrite = tile.backward(state, anchor("BLOCK_M:128->64"))
    env = {"M": 1024, "N": 1024, "K": 512, **devices.H200.facts()}
    buffers = {"x", "W", "y"}
    (old,) = resolve(state.plan, {**env, **state.constants}, buffers)
    (new,) = resolve(rewrite.state.plan, {**env, **rewrite.state.constants}, buffers)
    assert new.grid[0] == 2 * old.grid[0]
    assert new.shared < old.shared
