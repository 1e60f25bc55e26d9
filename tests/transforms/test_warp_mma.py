"""warp_mma: a warpgroup MMA (wgmma, both operands K-major shared tiles with the 128-byte swizzle)
becomes per-warp mma.sync on ldmatrix fragments; the last one takes the fences, commits and waits.

The block is checked against the PTX ISA's own models (tests/cuda_tools.py): shared tiles laid out
as TMA's 128-byte swizzle writes them, the descriptors' start address at each k16 slice, ldmatrix
.x4 and the mma.m16n8k16 fragments, and the wgmma accumulator layout. The test evaluates the
block's own address and accumulator-index expressions (C integer arithmetic that Python reads the
same way) and requires the warpgroup's 64 x N product, element for element. Whether the H200 agrees
is the gate's question on a GPU walk.
"""

from __future__ import annotations

import random
import re

import pytest

from klineage import corpus
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.transforms import NotApplicable, get
from tests.cuda_tools import (
    assert_wgmma_d,
    feature_counts,
    ldmatrix_x4,
    mma_pair_into,
    mma_pair_operands,
    ptx_a,
    swizzle_128b,
)
from tests.transforms.golden import HERE, check_golden, load

EXPERTS = {"gemm/wgmma_tma": 256, "conv2d/implicit_wgmma": 128, "fmha/flash_wgmma": 128}


@pytest.fixture(scope="module")
def transform():
    return get("warp_mma")


def golden(which: str) -> KernelState:
    return load(HERE / "warp_mma", which, "kernel")


def test_catalog_entry(transform):
    described = transform.describe()
    assert described["removes"] == ["wgmma", "hgmma"]
    assert described["adds"] == ["mma_sync", "ldmatrix", "hmma", "ldsm"]
    assert described["has_forward"] and transform.scope == "family"


def test_golden():
    check_golden("warp_mma")


def _sass(state: KernelState, cache) -> dict[str, int]:
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    assert not result.resources_for("kernel").spills
    return feature_counts(result)


def test_golden_kernels_compile_and_the_tensor_cores_change_kind(cache):
    before, after = _sass(golden("before"), cache), _sass(golden("after"), cache)
    assert before.get("hgmma") and not before.get("hmma")
    # one A and one B ldmatrix, two n8 MMAs; no HGMMA left, not even the commit group's placeholder
    assert not after.get("hgmma") and after.get("hmma") == 2 and after.get("ldsm") == 2


# -- the block against the ISA ----------------------------------------------------------------------


def _block(source: str, helper: str) -> str:
    start = source.index(f"void {helper}(")
    start = source.index("    {\n        // This warp's 16 rows", start)
    return source[start:source.index("\n    }\n", start)]


def warpgroup_product(block: str, n: int, ks: int, seed: int) -> None:
    """Run the block's addressing for k16 slice `ks` of a 64 x 64 A and an n x 64 B tile, both stored
    as TMA's 128-byte swizzle lays them out, and require D = A B in wgmma's accumulator layout."""
    rng = random.Random(seed)
    a = [[rng.randrange(-8, 8) for _ in range(64)] for _ in range(64)]
    b = [[rng.randrange(-8, 8) for _ in range(64)] for _ in range(n)]
    base_a, base_b, stride = 0x8000, 0x10000, 1024  # 1024-aligned tiles, 8-row groups 1024 bytes apart
    memory = {}
    for base, tile in ((base_a, a), (base_b, b)):
        for r, row in enumerate(tile):
            for k, value in enumerate(row):
                memory[swizzle_128b(base + (r // 8) * stride + (r % 8) * 128 + 2 * k)] = value

    def read_row(address: int) -> list[int]:
        return [memory[address + 2 * e] for e in range(8)]

    a_row, b_row = re.findall(r"const unsigned wgmma_r = ([^;]+);", block)
    a_address, b_address = re.findall(r'"r"\(wgmma_swizzle\((.+)\)\)\);', block)
    operands = mma_pair_operands(block)

    def evaluate(expression: str, **names: int) -> int:
        return eval(expression, {}, names)  # + - * >> & and parentheses: the same in C and in Python

    got: dict[tuple[int, int, int], int] = {}
    for warp in range(4):
        names = {"wgmma_row0": 16 * warp, "wgmma_a0": base_a + 32 * ks, "wgmma_b0": base_b + 32 * ks,
                 "wgmma_sa": stride, "wgmma_sb": stride}
        a_regs = ldmatrix_x4([swizzle_128b(evaluate(a_address, **names, wgmma_lane=lane,
                                                    wgmma_r=evaluate(a_row, **names, wgmma_lane=lane)))
                              for lane in range(32)], read_row)
        a_frag = {ptx_a(lane, e): a_regs[lane][e // 2][e % 2] for lane in range(32) for e in range(8)}
        for j in range(0, n // 8, 2):
            b_regs = ldmatrix_x4([swizzle_128b(evaluate(b_address, **names, wgmma_lane=lane,
                                                        wgmma_r=evaluate(b_row, **names, wgmma_j=j, wgmma_lane=lane)))
                                  for lane in range(32)], read_row)
            mma_pair_into(got, warp, a_frag, b_regs, operands, lambda index: evaluate(index, wgmma_j=j))
    assert_wgmma_d(got, n, lambda row, col: sum(a[row][16 * ks + k] * b[col][16 * ks + k] for k in range(16)))


@pytest.mark.parametrize("ks", range(4))
def test_the_golden_block_is_the_warpgroup_product(ks):
    warpgroup_product(_block(golden("after").source, "wgmma_m64n16k16"), 16, ks, seed=ks)


@pytest.fixture(scope="module")
def rewritten(transform):
    found = {}
    for name in EXPERTS:
        expert = corpus.kernel_entry(name).load()
        anchor = transform.find(expert)[0]
        found[name] = (expert, anchor, transform.backward(expert, anchor))
    return found


@pytest.mark.parametrize("name", EXPERTS)
def test_each_expert_block_is_the_warpgroup_product(rewritten, name):
    _, anchor, rewrite = rewritten[name]
    warpgroup_product(_block(rewrite.state.source, anchor.function), EXPERTS[name], ks=1, seed=7)


@pytest.mark.parametrize("name", EXPERTS)
def test_forward_restores_the_expert_byte_for_byte(transform, rewritten, name):
    expert, anchor, rewrite = rewritten[name]
    assert transform.forward(rewrite.state, anchor).state.source == expert.source


def test_the_last_wgmma_takes_the_fences_and_a_later_one_does_not(transform, rewritten):
    for name in ("gemm/wgmma_tma", "conv2d/implicit_wgmma"):  # one wgmma helper each
        code = re.sub(r"//[^\n]*", "", rewritten[name][2].state.source)  # the markers record what they replaced
        assert "3 fence/commit/wait" in rewritten[name][2].note and "wgmma." not in code
    fmha = rewritten["fmha/flash_wgmma"][2]  # wgmma_pv (A from registers) still needs them
    assert "fence" not in fmha.note and 'asm volatile("wgmma.fence' in fmha.state.source
    (pv,) = transform.find(fmha.state)  # and takes them (the register-A form: test_warp_mma_register_a.py)
    assert "3 fence/commit/wait" in transform.backward(fmha.state, pv).note


def test_an_expert_loses_every_hgmma(rewritten, tmp_path):
    result = compile_kernel(rewritten["conv2d/implicit_wgmma"][2].state, tmp_path)
    assert result.ok, result.log[-3000:]
    counts = feature_counts(result)
    assert not counts.get("hgmma") and counts.get("hmma") == 64 and counts.get("ldsm") == 36


# -- what it refuses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (lambda s: s.replace("accumulate, 1, 1, 0, 0", "accumulate, 1, 1, 0, 1"), "no negation, no transpose"),
    (lambda s: s.replace("accumulate, 1, 1, 0, 0", "accumulate, -1, 1, 0, 0"), "no negation, no transpose"),
    (lambda s: s.replace("f32.bf16.bf16", "f32.bf16.f16"), "mixes A and B types"),
    (lambda s: s.replace("m64n16k16.f32", "m64n8k16.f32"), "multiple of 16"),
    (lambda s: s.replace('"setp.ne.b32 accumulate, %10, 0;\\n"', '""'), "not a predicate set once"),
    (lambda s: s.replace('"+f"(d[7])', '"+f"(e)'), "not \"+f\"(X[7])"),
    (lambda s: s.replace(': "l"(desc_a)', ': "r"(desc_a)'), "constraint 'r'"),
])
def test_what_it_cannot_emulate_is_not_applicable(transform, change, message):
    before = golden("before")
    state = KernelState(source=change(before.source), plan=before.plan)
    (anchor,) = transform.find(state)
    with pytest.raises(NotApplicable, match=re.escape(message)):
        transform.backward(state, anchor)


def test_a_marker_without_its_statement_cannot_be_restored(transform):
    after = golden("after")
    (anchor,) = transform.find(golden("before"))
    stripped = re.sub(r"\n *//     verbatim:[^\n]*", "", after.source)
    with pytest.raises(NotApplicable, match="records no statement"):
        transform.forward(KernelState(source=stripped, plan=after.plan), anchor)
