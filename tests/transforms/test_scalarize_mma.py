"""scalarize_mma: an mma.sync m16n8k16 asm helper becomes shuffles of operand fragments and fp32 FMAs.

The scalar code is executed by the warp interpreter of test_scalarize_ldmatrix.py on fragments laid
out as the PTX ISA says (the A, B and C/D fragment models of tests/test_corpus_gemm.py): every lane
must end with D = A B + C for exactly the (row, column) elements mma.m16n8k16 gives it. With small
integer inputs every sum is exact, so the result must equal the exact product bit for bit; with
random inputs it must equal fp32 accumulation over k = 0 .. 15 in order, and the fp64 product within
fp32 rounding.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from klineage.corpus import kernel_entry
from klineage.features import cuda_parser as cp
from klineage.features.sass import sass_features
from klineage.features.source import source_features
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from sampled import sampled
from tests.test_corpus_gemm import ptx_a, ptx_b, ptx_c
from tests.transforms.golden import HERE, check_golden, load
from tests.transforms.test_scalarize_ldmatrix import Warp, function_body, parameters

CASES = {"bf16": ("mma_bf16_16816", "bf16"), "f16_separate_c": ("mma_f16", "f16"),
         "split_template": ("mma_split", "bf16")}
CANONICAL = ["bf16", "f16_separate_c"]  # the cases already in the layout forward renders
EXPERTS = {"gemm/mma_sync": ("gemm_bf16_mma_sync", "mma_bf16_16816", "bf16"),
           "conv2d/implicit_gemm": ("conv2d_implicit_gemm", "mma_16816", "f16")}


# -- fragments (PTX ISA layouts) -------------------------------------------------------------------


def bits_of(values: torch.Tensor, kind: str) -> np.ndarray:
    dtype = torch.bfloat16 if kind == "bf16" else torch.float16
    return values.to(dtype).view(torch.int16).numpy().astype(np.int64) & 0xFFFF


def floats_of(values: torch.Tensor, kind: str) -> np.ndarray:
    dtype = torch.bfloat16 if kind == "bf16" else torch.float16
    return values.to(dtype).float().numpy()


def fragments(a_bits: np.ndarray, b_bits: np.ndarray, c: np.ndarray):
    """Per lane: A registers (4), B registers (2), C values (4), packed as the ISA lays them out
    (element 2 r in the low half of register r)."""
    a_regs, b_regs, c_vals = [], [], []
    for lane in range(32):
        a_regs.append([int(a_bits[ptx_a(lane, 2 * r)]) | int(a_bits[ptx_a(lane, 2 * r + 1)]) << 16 for r in range(4)])
        b_regs.append([int(b_bits[ptx_b(lane, 2 * r)]) | int(b_bits[ptx_b(lane, 2 * r + 1)]) << 16 for r in range(2)])
        c_vals.append([np.float32(c[ptx_c(lane, i)]) for i in range(4)])
    return a_regs, b_regs, c_vals


def run_scalar_mma(source: str, helper: str, a_regs, b_regs, c_vals) -> tuple[list[list[np.float32]], Warp]:
    """Execute the scalarized helper on one warp; each lane's d[0..3]. Parameters are bound by the
    helper's own names and shapes: (d, a, b) arrays, or scalars a0.. b0.., or a separate c."""
    parsed, body = function_body(source, helper)
    warp = Warp(parsed)
    names = parameters(parsed, helper)
    d = [list(c) for c in c_vals]
    for name in names:
        if name == "d":
            warp.bind("d", d)
        elif name == "a":
            warp.bind("a", [list(r) for r in a_regs])
        elif name == "b":
            warp.bind("b", [list(r) for r in b_regs])
        elif name == "c":
            warp.bind("c", [list(v) for v in c_vals])
            d[:] = [[None] * 4 for _ in range(32)]
            warp.bind("d", d)
        elif name[0] in "ab" and name[1:].isdigit():
            regs = a_regs if name[0] == "a" else b_regs
            warp.bind(name, [regs[lane][int(name[1:])] for lane in range(32)], "uint32_t")
        else:
            raise AssertionError(f"unexpected parameter {name}")
    warp.run(body)
    return d, warp


def sequential_fp32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """D = A B + C in fp32, each element summed over k = 0 .. 15 in order (what the scalar code does)."""
    d = c.astype(np.float32).copy()
    for k in range(16):
        d = (d + np.outer(a[:, k], b[k, :]).astype(np.float32)).astype(np.float32)
    return d


def lane_results(d_of_lane) -> np.ndarray:
    out = np.zeros((16, 8), dtype=np.float32)
    seen = set()
    for lane in range(32):
        for i in range(4):
            out[ptx_c(lane, i)] = d_of_lane[lane][i]
            seen.add(ptx_c(lane, i))
    assert len(seen) == 128  # the 32 lanes x 4 accumulators cover D once
    return out


def check_helper(source: str, helper: str, kind: str, seed: int, small_integers: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    if small_integers:
        a = torch.randint(-4, 5, (16, 16), generator=generator).float()
        b = torch.randint(-4, 5, (16, 8), generator=generator).float()
        c = torch.randint(-50, 51, (16, 8), generator=generator).float().numpy()
    else:
        a = torch.randn(16, 16, generator=generator) * 3
        b = torch.randn(16, 8, generator=generator)
        c = (torch.randn(16, 8, generator=generator) * 10).numpy().astype(np.float32)
    a_bits, b_bits = bits_of(a, kind), bits_of(b, kind)
    a_f, b_f = floats_of(a, kind), floats_of(b, kind)
    d, warp = run_scalar_mma(source, helper, *fragments(a_bits, b_bits, c))
    got = lane_results(d)
    assert warp.shuffles == 32
    exact = a_f.astype(np.float64) @ b_f.astype(np.float64) + c.astype(np.float64)
    if small_integers:
        assert np.array_equal(got.astype(np.float64), exact)
    else:
        assert np.array_equal(got, sequential_fp32(a_f, b_f, c))
        assert np.allclose(got, exact, rtol=1e-5, atol=1e-4)


# -- tests -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_mma")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_mma" / case, which, "kernel")


def compile_ok(state: KernelState, cache):
    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    return result


def test_catalog_entry(transform):
    described = transform.describe()
    assert described["removes"] == ["mma_sync", "hmma"] and described["adds"] == ["shfl", "ffma"]
    assert described["after"] == [] and described["has_forward"]


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_mma", case)


@pytest.mark.parametrize("case", CANONICAL)
def test_canonical_layout_keeps_the_marker_without_a_verbatim_copy(case):
    """An asm statement in the canonical layout gives the marker it always gave (the committed
    lineages of such experts stay valid): forward renders it back without a verbatim copy."""
    assert "verbatim:" not in golden(case, "after").source


def test_a_non_canonical_layout_is_recorded_verbatim_and_restored_byte_for_byte(transform):
    """split_template splits its template string at every operand group, aligns its operands its own
    way and has a blank line inside the statement: the canonical rendering differs, so the marker
    records the statement line by line (continuation lines relative to the statement's indentation),
    and forward(backward(x)) == x byte for byte."""
    before, after = golden("split_template", "before"), golden("split_template", "after")
    (anchor,) = transform.find(before)
    assert transform.backward(before, anchor).state.source == after.source
    assert transform.forward(after, anchor).state.source == before.source
    statement = before.source[before.source.index("    asm volatile("):before.source.index("    );") + len("    );")]
    recorded = [line for line in after.source.splitlines() if "//     verbatim:" in line]
    assert recorded == [f"    //     verbatim: {line[4:]}" if line else "    //     verbatim:"
                        for line in statement.splitlines()]
    assert recorded[5] == "    //     verbatim:"  # the blank line
    assert recorded[6] == '    //     verbatim:         :   "+f"(d[0]), "+f"(d[1]),'


def test_a_reindented_marker_restores_the_statement_at_its_new_indentation(transform):
    """A later step may nest the scalarized site deeper (a loop or block around it): forward restores
    the verbatim statement at the marker's indentation, its continuation lines keeping their
    indentation relative to its first line."""
    before, after = golden("split_template", "before"), golden("split_template", "after")

    def nest(source: str) -> str:
        head = "const uint32_t (&b)[2])\n{\n"
        start = source.index(head) + len(head)
        end = source.index("\n}\n", start)
        body = "\n".join("    " + line if line else line for line in source[start:end].split("\n"))
        return source[:start] + "    {\n" + body + "\n    }" + source[end:]

    (anchor,) = transform.find(before)
    nested = KernelState(source=nest(after.source), plan=after.plan)
    assert not cp.syntax_errors(nested.source)
    assert transform.forward(nested, anchor).state.source == nest(before.source)


def test_the_expert_layouts_of_conv2d_and_gdn_are_restored_byte_for_byte(transform):
    """conv2d/implicit_gemm splits its template after the B operands, gdn/chunked writes {%0,%1,..}
    without spaces inside a loop: both used to come back in the canonical layout (the walk recorded
    the forward step as failed); the marker now records them verbatim."""
    for name in ("conv2d/implicit_gemm", "gdn/chunked"):
        state = kernel_entry(name).load()
        (anchor,) = transform.find(state)
        rewrite = transform.backward(state, anchor)
        assert "//     verbatim: asm" in rewrite.state.source
        assert transform.forward(rewrite.state, anchor).state.source == state.source


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile_and_lose_hmma(case, cache):
    helper, _ = CASES[case]
    before, after = compile_ok(golden(case, "before"), cache), compile_ok(golden(case, "after"), cache)
    assert sass_features(before.cubin_bytes()).count("hmma", "kernel") == 1
    sass = sass_features(after.cubin_bytes())
    assert sass.count("hmma", "kernel") == 0
    assert sass.count("shfl", "kernel") == 32 and sass.count("ffma", "kernel") == 64
    assert not after.resources_for("kernel").spills
    features = {(f.locus, f.name) for f in source_features(golden(case, "after").source)}
    assert (helper, "mma_sync") not in features and (helper, "shfl") in features


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_scalar_code_is_the_isa_product_exactly_on_integers(case, seed):
    helper, kind = CASES[case]
    check_helper(golden(case, "after").source, helper, kind, seed, small_integers=True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_scalar_code_accumulates_in_fp32_in_k_order(case, seed):
    helper, kind = CASES[case]
    check_helper(golden(case, "after").source, helper, kind, seed, small_integers=False)


def test_a_wrong_fragment_mapping_is_caught():
    """Swapping the two A rows a lane combines gives wrong results: the check is not vacuous."""
    source = golden("bf16", "after").source.replace("mma_h == 0 ? mma_a1 : mma_a3", "mma_h == 0 ? mma_a0 : mma_a2")
    with pytest.raises(AssertionError):
        check_helper(source, "mma_bf16_16816", "bf16", 0, small_integers=True)


def test_anchor_note_and_forward(transform):
    (anchor,) = transform.find(golden("bf16", "before"))
    assert anchor == Anchor("mma_bf16_16816", "asm", "mma_bf16_16816")
    rewrite = transform.backward(golden("bf16", "before"), anchor)
    assert "32 shuffles and 64 fp32 FMAs" in rewrite.note
    assert transform.find(rewrite.state) == []
    with pytest.raises(NotApplicable, match="already scalar"):
        transform.backward(rewrite.state, anchor)
    with pytest.raises(NotApplicable, match="already uses mma.sync"):
        transform.forward(golden("bf16", "before"), anchor)


def _helper(asm: str, include: str = "#include <cuda_bf16.h>\n") -> KernelState:
    source = (include + "#include <cstdint>\n__device__ void h(float (&d)[4], const uint32_t (&a)[4], "
              "const uint32_t (&b)[2], float c0)\n{\n    " + asm + "\n}\nextern \"C\" __global__ void kernel() {}\n")
    plan = LaunchPlan.from_toml('name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = [1]\nblock = [32]\n')
    return KernelState(source=source, plan=plan)


_OUT = '"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])'
_IN = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])'


@pytest.mark.parametrize("asm, include, message", [
    (f'asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {{%0, %1, %2, %3}}, {{%4, %5}}, {{%6}}, '
     f'{{%0, %1, %2, %3}};" : {_OUT} : "r"(a[0]), "r"(a[1]), "r"(b[0]));', None, "only mma.sync m16n8k16"),
    (f'asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {{%0, %1}}, {{%2, %3, %4, %5}}, {{%6, %7}}, '
     f'{{%0, %1}};" : "+r"(a[0]), "+r"(a[1]) : {_IN});', None, "unsupported instruction form"),
    (f'asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, '
     f'{{%8, %9}}, {{%0, %1, %2, %3}};" : {_OUT} : {_IN});', "#include <cuda_fp16.h>\n", "needs <cuda_bf16.h>"),
    (f'asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, '
     f'{{%8, %9}}, {{%10, %10, %10, %10}};" : {_OUT} : {_IN}, "f"(c0));', None, "accumulator must be the outputs"),
    (f'asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, '
     f'{{%8, %9}}, {{%0, %1, %2, %3}};" : {_OUT} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), '
     '"r"(mma_lane));', None, "clash with the scalar code's locals"),
    (f'asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, '
     f'{{%8, %9}}, {{%0, %1, %2, %3}};" : {_OUT} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), '
     '"r"(b[1]));', None, "not a 32-bit register input"),
])
def test_not_applicable(transform, asm, include, message):
    state = _helper(asm, include if include is not None else "#include <cuda_bf16.h>\n")
    (anchor,) = transform.find(state)
    with pytest.raises(NotApplicable, match=message):
        transform.backward(state, anchor)


def test_wgmma_is_not_a_site(transform):
    state = _helper('asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");')
    assert transform.find(state) == []


_SPLIT = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "


@pytest.mark.parametrize("asm, message", [
    # A continuation line left of the statement: its indentation relative to the marker is undefined.
    (f'asm volatile("{_SPLIT}"\n"{{%8, %9}}, {{%0, %1, %2, %3}};\\n"\n    : {_OUT} : {_IN});',
     "indented less than the statement"),
    # A line spliced with backslash-newline: in a // comment the backslash would splice the next line.
    (f'asm volatile("{_SPLIT}{{%8, %9}}, {{%0, %1, %2, %3}};\\n" \\\n    : {_OUT} : {_IN});',
     "trailing backslash"),
])
def test_a_layout_a_comment_cannot_record_is_not_applicable(transform, asm, message):
    """The canonical layout cannot restore these statements and a verbatim record could not either:
    the transform declines rather than write a step whose forward is not its inverse."""
    state = _helper(asm)
    (anchor,) = transform.find(state)
    with pytest.raises(NotApplicable, match=message):
        transform.backward(state, anchor)


# -- the real experts ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rewritten_experts(transform):
    out = {}
    for name in EXPERTS:
        state = kernel_entry(name).load()
        (anchor,) = transform.find(state)
        out[name] = (state, anchor, transform.backward(state, anchor))
    return out


@pytest.mark.parametrize("name", EXPERTS)
def test_expert_rewrite_parses_and_features_move(transform, rewritten_experts, name):
    state, anchor, rewrite = rewritten_experts[name]
    _, helper, _ = EXPERTS[name]
    assert anchor == Anchor(helper, "asm", helper)
    assert not cp.syntax_errors(rewrite.state.source) and transform.find(rewrite.state) == []
    features = {(f.locus, f.name) for f in source_features(rewrite.state.source)}
    assert (helper, "mma_sync") not in features and (helper, "shfl") in features
    assert not any(name == "mma_sync" for _, name in features)
    assert any(name == "ldmatrix" for _, name in features)  # one mechanism at a time
    # Nothing beyond the declared features appears at the helper (no unroll pragmas, no arrays).
    before = {f.name for f in source_features(state.source) if f.locus == helper}
    assert {name for locus, name in features if locus == helper} - before == {"shfl"}


def test_gemm_forward_restores_the_expert_byte_for_byte(transform, rewritten_experts):
    state, anchor, rewrite = rewritten_experts["gemm/mma_sync"]
    assert transform.forward(rewrite.state, anchor).state.source == state.source


def test_conv_forward_restores_the_expert_byte_for_byte(transform, rewritten_experts):
    """The conv expert splits its mma template string elsewhere than the canonical layout: the marker
    records the statement verbatim, so forward gives the expert back byte for byte."""
    state, anchor, rewrite = rewritten_experts["conv2d/implicit_gemm"]
    assert transform.forward(rewrite.state, anchor).state.source == state.source
    recorded = [line for line in rewrite.state.source.splitlines() if "//     verbatim:" in line]
    assert recorded[:2] == [
        '    //     verbatim: asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, '
        '{%4, %5, %6, %7}, {%8, %9}, "',
        '    //     verbatim:     "{%0, %1, %2, %3};\\n"']
    assert len(recorded) == 4


@pytest.mark.parametrize("name", EXPERTS)
@pytest.mark.parametrize("seed", range(2))
def test_expert_helper_is_the_isa_product(rewritten_experts, name, seed):
    _, _, rewrite = rewritten_experts[name]
    _, helper, kind = EXPERTS[name]
    check_helper(rewrite.state.source, helper, kind, seed, small_integers=True)
    check_helper(rewrite.state.source, helper, kind, seed + 10, small_integers=False)


# nvcc on a whole scalarized expert (the gemm one about 14 s, the conv2d one about 45 s on two cores): -m slow; the
# mechanism's compile stays in the default run on the golden kernels (test_golden_kernels_compile_and_lose_hmma)
@pytest.mark.parametrize("name", sampled(EXPERTS, keep=()))
def test_expert_compiles_and_hmma_is_gone(rewritten_experts, cache, name):
    """The experts compile with HMMA replaced by 64 FFMA per MMA. Registers grow: the register-blocked
    warp tiles (4 x 8 and 3 x 8 MMAs per k-step) share each A fragment across a row of MMAs and each
    B fragment across a column, so the compiler merges the identical operand shuffles of those MMAs
    and keeps the gathered operands live across the whole k-step; the kernels then spill (recorded,
    and reported as a warning, since the gate accepts spills and a later walk step that removes the
    register blocking removes them)."""
    state, _, rewrite = rewritten_experts[name]
    entry, _, _ = EXPERTS[name]
    before, after = compile_ok(state, cache), compile_ok(rewrite.state, cache)
    for arch in after.targets:
        old, new = sass_features(before.cubin_bytes(arch)), sass_features(after.cubin_bytes(arch))
        assert old.count("hmma", entry) > 0 and new.count("hmma", entry) == 0
        assert new.count("ffma", entry) == 64 * old.count("hmma", entry)
        assert new.count("shfl", entry) > 0
        assert new.count("ldsm", entry) == old.count("ldsm", entry)
        res = after.resources_for(entry, arch)
        assert res.registers <= 255
        if res.spills:
            warnings.warn(f"scalarize_mma on {name} ({arch}): {res.registers} registers, "
                          f"{res.spill_store_bytes} bytes spill stores, {res.spill_load_bytes} bytes spill loads, "
                          f"{new.count('shfl', entry)} SHFL for {old.count('hmma', entry)} HMMA", stacklevel=1)
