"""block_swizzle: a grouped block rasterization helper becomes plain row-major block order."""

from __future__ import annotations

import subprocess

import pytest

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.toolchain import find_toolchain
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

EXPERTS = ["gemm/mma_sync", "gemm/mma_sync_any"]
GRIDS = [(32, 16), (1, 16), (16, 12), (1, 1), (33, 7), (9, 3), (8, 1), (17, 2), (5, 40)]
HARNESS = r"""
#include <cstdio>
#undef __device__
#define __device__ __attribute__((host)) __attribute__((device))
constexpr int GROUP_M = GROUP_SIZE;
HELPER
int main()
{
    const int grids[][2] = {GRIDS};
    for (const auto& g : grids)
        for (int b = 0; b < g[0] * g[1]; ++b) {
            int tm, tn;
            tile_coordinates(b, g[0], g[1], tm, tn);
            printf("%d %d %d %d %d\n", g[0], g[1], b, tm, tn);
        }
    return 0;
}
"""


@pytest.fixture(scope="module")
def swizzle():
    return get("block_swizzle")


def host_mapping(source: str, group: int, work) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The helper of `source`, built for the host by nvcc: block -> (tile_m, tile_n) per grid."""
    helper = next(f for f in cp.functions(source) if f.name == "tile_coordinates")
    program = (HARNESS.replace("GROUP_SIZE", str(group)).replace("HELPER", cp.parse(source).text(helper.node))
               .replace("GRIDS", ", ".join(f"{{{m}, {n}}}" for m, n in GRIDS)))
    (work / "harness.cu").write_text(program)
    toolchain = find_toolchain()
    build = subprocess.run([toolchain.nvcc, "-std=c++17", "-o", "harness", "harness.cu"], cwd=work,
                           capture_output=True, text=True, env=toolchain.environment(work), timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(work / "harness")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    mapping: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for line in run.stdout.splitlines():
        tiles_m, tiles_n, _, tm, tn = (int(v) for v in line.split())
        mapping.setdefault((tiles_m, tiles_n), []).append((tm, tn))
    return mapping


def test_golden():
    check_golden("block_swizzle")


def test_golden_kernels_compile(cache):
    for which in ("before", "after"):
        compiles_without_spills(load(HERE / "block_swizzle", which, "kernel"), cache)


def test_anchor_carrier_and_features(swizzle):
    before = load(HERE / "block_swizzle", "before", "kernel")
    (anchor,) = swizzle.find(before)
    assert anchor == Anchor("tile_coordinates", "function", "tile_coordinates:GROUP_M")
    rewrite = swizzle.backward(before, anchor)
    assert rewrite.carrier["group"] == "GROUP_M" and rewrite.carrier["group_size"] == 4
    assert "const int per_group = GROUP_M * tiles_n;" in rewrite.carrier["helper_body"]
    assert rewrite.removes == () and swizzle.describe()["removes"] == []  # no source feature names it
    assert swizzle.find(rewrite.state) == []


@pytest.mark.parametrize("name", EXPERTS)
def test_experts_rasterize_linearly_and_compile(name, swizzle, cache, tmp_path):
    state = kernel_entry(name).load()
    (anchor,) = swizzle.find(state)
    assert anchor.key == "tile_coordinates:GROUP_M"
    rewrite = swizzle.backward(state, anchor)
    assert not cp.syntax_errors(rewrite.state.source)
    assert "tile_m = block / tiles_n;\n    tile_n = block % tiles_n;" in rewrite.state.source
    assert swizzle.forward(rewrite.state, anchor).state.source == state.source
    compiles_without_spills(rewrite.state, cache)
    # Both orders cover every tile exactly once (the kernel's own helper, built for the host).
    group = state.constants["GROUP_M"]
    grouped = host_mapping(state.source, group, tmp_path)
    linear = host_mapping(rewrite.state.source, group, tmp_path)
    for tiles_m, tiles_n in GRIDS:
        every_tile = [(i, j) for i in range(tiles_m) for j in range(tiles_n)]
        assert sorted(grouped[(tiles_m, tiles_n)]) == every_tile
        assert linear[(tiles_m, tiles_n)] == every_tile  # row-major: block b is (b / tiles_n, b % tiles_n)
    assert grouped[(32, 16)][:group] == [(i, 0) for i in range(group)]


def test_not_applicable_cases(swizzle):
    before = load(HERE / "block_swizzle", "before", "kernel")
    after = load(HERE / "block_swizzle", "after", "kernel")
    anchor = Anchor("tile_coordinates", "function", "tile_coordinates:GROUP_M")
    with pytest.raises(NotApplicable, match="body is not the plain row-major order"):
        swizzle.forward(before, anchor)
    with pytest.raises(NotApplicable, match="does not group by GROUP_N"):
        swizzle.backward(before, Anchor("tile_coordinates", "function", "tile_coordinates:GROUP_N"))
    with pytest.raises(NotApplicable, match="kernel is not a block-order helper"):
        swizzle.backward(before, Anchor("kernel", "function", "kernel:GROUP_M"))
    with pytest.raises(NotApplicable, match="no namespace-scope constant GROUP_N"):
        swizzle.forward(after, Anchor("tile_coordinates", "function", "tile_coordinates:GROUP_N"))
    clashing = after.with_source(after.source.replace("tiles_n", "rows"))
    with pytest.raises(NotApplicable, match=r"parameter names \['rows'\] clash"):
        swizzle.forward(clashing, anchor)


def test_helpers_not_fed_by_blockidx_or_of_another_shape_are_not_sites(swizzle):
    before = load(HERE / "block_swizzle", "before", "kernel")
    unfed = before.with_source(before.source.replace("tile_coordinates(blockIdx.x,", "tile_coordinates(7,"))
    assert swizzle.find(unfed) == []
    through_local = before.with_source(before.source.replace(
        "    tile_coordinates(blockIdx.x,", "    const int bid = blockIdx.x;\n    tile_coordinates(bid,"))
    assert [a.key for a in swizzle.find(through_local)] == ["tile_coordinates:GROUP_M"]
    ungrouped = before.with_source(before.source.replace("GROUP_M", "STRIDE_M"))
    assert swizzle.find(ungrouped) == []


@pytest.mark.parametrize("name", ["row_softmax/warp_vec4", "conv2d/implicit_gemm", "topk/radix_select", "gemm/naive"])
def test_experts_without_a_swizzle_have_no_sites(name, swizzle):
    assert swizzle.find(kernel_entry(name).load()) == []
