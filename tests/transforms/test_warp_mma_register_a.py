"""warp_mma on wgmma's register-A form: A from four registers per thread, B an MN-major shared tile
with the 128-byte swizzle (imm-trans-b = 1), as FMHA's `P V` (fmha/flash_wgmma's wgmma_pv) issues it.

The block is held to the PTX ISA's models (tests/cuda_tools.py): B tiles stored as TMA's 128-byte
swizzle writes them, the descriptor and what wgmma reads through it with B transposed
(`wgmma_b_address`), wgmma's register-A fragment (`ptx_wgmma_a`), ldmatrix .x4.trans, the
mma.m16n8k16 fragments and wgmma's accumulator layout. The test evaluates the block's own
descriptor-field, address and register expressions (C integer arithmetic that Python reads the
same way) and requires the warpgroup's 64 x N product element for element.
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
    ptx_wgmma_a,
    swizzle_128b,
    tma_box_128b,
    wgmma_b_address,
    wgmma_descriptor,
)
from tests.transforms.golden import HERE, check_golden, load

KEYS = 64  # k rows of the test's B tile: four k16 steps


@pytest.fixture(scope="module")
def transform():
    return get("warp_mma")


def golden(which: str) -> KernelState:
    return load(HERE / "warp_mma" / "register_a", which, "kernel")


def counts(state: KernelState, cache) -> tuple[dict[str, int], object]:
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    assert result.targets == ("sm_90a",)
    return feature_counts(result), result


def test_golden():
    check_golden("warp_mma", "register_a")


def test_golden_kernels_compile_and_the_tensor_cores_change_kind(cache):
    (before, _), (after, result) = counts(golden("before"), cache), counts(golden("after"), cache)
    assert before.get("hgmma") and not before.get("hmma") and not before.get("ldsm")
    # 8 ldmatrix.x4.trans (two n8 tiles each) and 16 n8 MMAs; no HGMMA left, not even a commit group's
    assert not after.get("hgmma") and after.get("hmma") == 16 and after.get("ldsm") == 8
    assert not result.resources_for("kernel").spills


# -- the block against the ISA ----------------------------------------------------------------------

def _block(source: str, helper: str) -> tuple[str, list[str]]:
    """The helper's mma.sync block, and the A registers its marker records (the wgmma's, in order)."""
    start = source.index(f"void {helper}(")
    registers = re.search(r"\{\w+\[0 \.\. \d+\]\}, \{([^{}]*)\}", source[start:]).group(1).split(", ")
    start = source.index("    {\n        // This warp's 16 rows", start)
    return source[start:source.index("\n    }\n", start)], registers


def _c(expression: str) -> str:
    """A C integer expression of the block as Python: casts dropped, || as or."""
    return re.sub(r"static_cast<unsigned>", "", expression).replace("||", " or ")


def evaluate(expression: str, **names) -> int:
    return eval(_c(expression), {}, names)  # + - * >> << & ^ != == and parentheses: the same in C and Python


LAYOUTS = {
    # FMHA's V: one TMA box of KEYS rows per 64 columns, boxes one after the other (LBO = a box,
    # SBO = 1024: the 8-line atoms of a box are consecutive)
    "boxes": lambda n_blocks: (KEYS * 128, 1024, lambda k, n: ((n // 64) * KEYS * 128 + (k // 8) * 1024, k % 8)),
    # the same atoms interleaved (atom (k / 8, n / 64) at ((k / 8) n_blocks + n / 64) 1024): LBO = 1024,
    # SBO = n_blocks 1024, so a block that swapped the two offsets reads the wrong lines
    "interleaved": lambda n_blocks: (1024, n_blocks * 1024,
                                     lambda k, n: (((k // 8) * n_blocks + n // 64) * 1024, k % 8)),
}


def register_a_product(block: str, registers: list[str], n: int, layout: str, ks: int, seed: int) -> None:
    """Store a KEYS x n B tile (k rows, n columns) as TMA's 128-byte swizzle writes it in `layout`,
    give every warpgroup thread its register-A fragment of a random 64 x 16 A, run the block's
    addressing for k16 step `ks`, and require D = A B[16 ks .. 16 ks + 15] in wgmma's layout."""
    rng = random.Random(seed)
    a = [[rng.randrange(-8, 8) for _ in range(16)] for _ in range(64)]
    b = [[rng.randrange(-8, 8) for _ in range(n)] for _ in range(KEYS)]
    base, n_blocks = 0x10000, -(-n // 64)
    leading, stride, box = LAYOUTS[layout](n_blocks)
    memory = {}
    for k in range(KEYS):
        for col in range(n):
            offset, row = box(k, col)
            memory[tma_box_128b(base + offset, row, col % 64)] = b[k][col]
    descriptor = wgmma_descriptor(base + 2 * stride * ks, leading, stride)
    # the descriptor says what TMA wrote: wgmma's MN-major read of element (k, n) of the step
    for k in range(16):
        for col in range(n):
            assert memory[wgmma_b_address(descriptor, 1, k, col)] == b[16 * ks + k][col]

    def read_row(address: int) -> list[int]:
        return [memory[address + 2 * e] for e in range(8)]

    # the block's trap: none for this descriptor, one for every other swizzle mode or a base offset
    (trap,) = re.findall(r"if \((\(wgmma_db >> 62\)[^\n]*)\)\n\s*__trap\(\);", block)
    assert not evaluate(trap, wgmma_db=descriptor)
    for other in (wgmma_descriptor(base, leading, stride, swizzle=s) for s in (0, 2, 3)):
        assert evaluate(trap, wgmma_db=other)
    assert evaluate(trap, wgmma_db=wgmma_descriptor(base, leading, stride, base_offset=1))
    names = {name: evaluate(value, wgmma_db=descriptor)
             for name, value in re.findall(r"const unsigned (wgmma_b0|wgmma_lb|wgmma_sb) = ([^;]+);", block)}
    assert sorted(names) == ["wgmma_b0", "wgmma_lb", "wgmma_sb"]
    (k_row,) = re.findall(r"const unsigned wgmma_k = ([^;]+);", block)
    (n_col,) = re.findall(r"const unsigned wgmma_n = ([^;]+);", block)
    (a_init,) = re.findall(r"const unsigned wgmma_af\[4\] = \{([^{}]+)\};", block)
    (address,) = re.findall(r'"r"\(wgmma_swizzle\((.+)\)\)\);', block)
    (ldsm,) = re.findall(r'asm volatile\("(ldmatrix\S+)', block)
    operands = mma_pair_operands(block)
    a_slots = [re.findall(r'"r"\((wgmma_af\[\d\])\)', m) for m in block.split('asm volatile("mma.sync')[1:]]
    assert all(s == [f"wgmma_af[{i}]" for i in range(4)] for s in a_slots)

    (swizzle,) = re.findall(r"\[\]\(unsigned wgmma_at\) \{ return ([^;]+); \}", block)
    assert all(evaluate(swizzle, wgmma_at=x) == swizzle_128b(x) for x in range(0, 1 << 16, 16))

    got: dict[tuple[int, int, int], int] = {}
    for warp in range(4):
        a_frag: dict[tuple[int, int], int] = {}  # mma's A tile: this warp's 16 rows
        for lane in range(32):
            t = 32 * warp + lane
            # the thread's wgmma registers: register r holds a_(2r) (low half) and a_(2r+1)
            held = {name: tuple(a[row][k] for row, k in (ptx_wgmma_a(t, 2 * r), ptx_wgmma_a(t, 2 * r + 1)))
                    for r, name in enumerate(registers)}
            af = [eval(x.strip(), {}, held) for x in a_init.split(",")]
            for e in range(8):
                a_frag[ptx_a(lane, e)] = af[e // 2][e % 2]
        assert len(a_frag) == 256
        lane_k = [evaluate(k_row, wgmma_lane=lane) for lane in range(32)]
        for j in range(0, n // 8, 2):
            b_regs = ldmatrix_x4([swizzle_128b(evaluate(address, **names, wgmma_k=lane_k[lane],
                                                        wgmma_n=evaluate(n_col, wgmma_j=j, wgmma_lane=lane)))
                                  for lane in range(32)], read_row, trans=".trans" in ldsm)
            mma_pair_into(got, warp, a_frag, b_regs, operands, lambda index: evaluate(index, wgmma_j=j))
    assert_wgmma_d(got, n, lambda row, col: sum(a[row][k] * b[16 * ks + k][col] for k in range(16)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ks", range(4))
def test_the_golden_block_is_the_warpgroup_product(layout, ks):
    block, registers = _block(golden("after").source, "wgmma_m64n128k16_rs")
    register_a_product(block, registers, 128, layout, ks, seed=ks)


@pytest.mark.parametrize("n", [16, 80])
def test_other_widths(transform, n):
    """N = 16 (one pair of n8 tiles, LBO unused) and N = 80 (a pair past the first 64 columns)."""
    before = golden("before")
    source = before.source.replace("m64n128k16.f32", f"m64n{n}k16.f32")
    source = re.sub(r'"%0, %1, .*?%63\}, "', '"' + ", ".join(f"%{i}" for i in range(n // 2)) + '}, "', source,
                    flags=re.S)
    source = source.replace("%64, %65, %66, %67}, %68", f"%{n // 2}, %{n // 2 + 1}, %{n // 2 + 2}, "
                            f"%{n // 2 + 3}}}, %{n // 2 + 4}").replace("%69, 0", f"%{n // 2 + 5}, 0")
    source = re.sub(r': "\+f"\(d\[0\]\).*?"\+f"\(d\[63\]\)',
                    ": " + ", ".join(f'"+f"(d[{i}])' for i in range(n // 2)), source, flags=re.S)
    state = KernelState(source=source, plan=before.plan)
    (anchor,) = transform.find(state)
    rewrite = transform.backward(state, anchor)
    block, registers = _block(rewrite.state.source, "wgmma_m64n128k16_rs")
    for layout in LAYOUTS:
        register_a_product(block, registers, n, layout, ks=3, seed=n)


# -- the FMHA expert: both wgmma sites ------------------------------------------------------------------

@pytest.fixture(scope="module")
def fmha(transform):
    expert = corpus.kernel_entry("fmha/flash_wgmma").load()
    qk, pv = transform.find(expert)
    assert (qk.function, pv.function) == ("wgmma_qk", "wgmma_pv")
    first = transform.backward(expert, qk)
    (pv_now,) = transform.find(first.state)
    return expert, qk, pv, first, transform.backward(first.state, pv_now)


def test_the_expert_pv_block_is_the_warpgroup_product(fmha):
    """V as the expert lays it out: two 64-column boxes of 128 keys (LBO 16 KiB), 8-key groups 1024
    bytes apart, a k16 step 2048 bytes further; P V is m64n128k16."""
    block, registers = _block(fmha[4].state.source, "wgmma_pv")
    assert registers == ["a0", "a1", "a2", "a3"]
    for ks in (0, 3):
        register_a_product(block, registers, 128, "boxes", ks, seed=11 + ks)


def test_the_last_wgmma_takes_the_fences_in_either_order(transform, fmha):
    expert, qk, pv, first, both = fmha
    assert "fence" not in first.note and "3 fence/commit/wait" in both.note
    code = re.sub(r"//[^\n]*", "", both.state.source)  # the markers record what they replaced
    assert "wgmma." not in code
    pv_first = transform.backward(expert, pv)
    assert "fence" not in pv_first.note
    (qk_now,) = transform.find(pv_first.state)
    assert "3 fence/commit/wait" in transform.backward(pv_first.state, qk_now).note


def test_forward_restores_the_expert_byte_for_byte(transform, fmha):
    expert, qk, pv, first, both = fmha
    # either anchor first: its forward restores its wgmma and every fence, commit and wait
    undone = transform.forward(transform.forward(both.state, pv).state, qk)
    assert undone.state.source == expert.source
    undone = transform.forward(transform.forward(both.state, qk).state, pv)
    assert undone.state.source == expert.source


def test_the_expert_compiles_with_no_hgmma_left(fmha, cache):
    found, result = counts(fmha[4].state, cache)
    assert not found.get("hgmma")
    # per consumer warp and key tile: Q K^T 8 steps x (1 + 8) ldmatrix, P V 8 steps x 8 ldmatrix.trans;
    # 16 n8 MMAs per step of each
    assert found.get("hmma") and found.get("ldsm") and found.get("utmaldg")


# -- what it refuses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (lambda s: s.replace("accumulate, 1, 1, 1;", "accumulate, 1, 1, 0;"), "only 1, 1, 1"),
    (lambda s: s.replace("accumulate, 1, 1, 1;", "accumulate, 1, -1, 1;"), "only 1, 1, 1"),
    (lambda s: s.replace("accumulate, 1, 1, 1;", "accumulate, 1, 1, 0, 1;"), "needs b-desc, scale-d"),
    (lambda s: s.replace("m64n128k16.f32.f16.f16", "m64n128k16.f32.f16.bf16"), "mixes A and B types"),
    (lambda s: s.replace("{%64, %65, %66, %67}", "{%64, %65, %66}"), "not the four"),
    (lambda s: s.replace('"r"(a2)', '"h"(a2)'), "constraint 'h'"),
    (lambda s: s.replace('"l"(desc_b)', '"r"(desc_b)'), "constraint 'r'"),
    (lambda s: s.replace('"setp.ne.b32 accumulate, %69, 0;\\n"', '""'), "not a predicate set once"),
])
def test_what_it_cannot_emulate_is_not_applicable(transform, change, message):
    before = golden("before")
    source = change(before.source)
    assert source != before.source
    state = KernelState(source=source, plan=before.plan)
    (anchor,) = transform.find(state)
    with pytest.raises(NotApplicable, match=re.escape(message)):
        transform.backward(state, anchor)
