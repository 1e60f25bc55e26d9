"""scalarize_half_packs: eight half or bf16 elements per thread as 16-byte packs (a scalar path for the tail and for
misaligned pointers) become one element per thread; forward finds its sites by analysis, and what it writes
computes what the naive kernel computes (on the CPU emulator, aligned and misaligned, with and without a tail)."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, assert_packs_are_128_bit, check_golden, load, plan_of

CASES = ["axpy_half", "silu_mul_bf16", "scale_in_place"]
SITE = Anchor("kernel", "function", "i")


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_half_packs")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_half_packs" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_half_packs", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('silu_mul_bf16',)))
def test_golden_kernels_compile_and_the_packs_are_128_bit(case, cache):
    assert_packs_are_128_bit(golden(case, "after"), golden(case, "before"), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    assert [a.key for a in transform.forward_sites(golden(case, "after"))] == ["i"]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []


def test_each_width_keeps_to_its_own_data(transform):
    """32-bit kernels are scalarize_elementwise's (four per float4), 16-bit ones this transform's."""
    floats = load(HERE / "scalarize_elementwise" / "scale", "after", "kernel")
    assert transform.forward_sites(floats) == []
    assert get("scalarize_elementwise").forward_sites(golden("axpy_half", "after")) == []


def test_the_pack_path_is_guarded_and_the_tail_is_scalar(transform):
    packed = transform.forward(golden("axpy_half", "after"), SITE).state
    assert "if (i + 7 < n && (((size_t)x | (size_t)y | (size_t)z) & 15) == 0) {" in packed.source
    assert "for (int e = i; e < n && e < i + 8; ++e) z[e] =" in packed.source
    assert packed.plan.launches[0].grid[0] == "cdiv(cdiv(n, 256), 8)"


PLAN = plan_of('"x", "y", { scalar = "n", type = "i32" }')
HEAD = ("#include <cuda_fp16.h>\n__global__ void kernel(const __half* x, __half* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n")


@pytest.mark.parametrize("body, why", [
    ("    if (i < n) y[i + 1] = x[i];\n", r"writes `y\[i \+ 1\]`, not element i"),
    ("    if (i < n) { y[i] = x[i]; ++i; }\n", "writes or declares 'i'"),
    ("    if (i < n) { if (__half2float(x[i]) > 0.0f) y[i] = x[i]; }\n", "only under a condition"),
    ("    if (i < n) y[i] = foo(x[i]);\n", "calls foo"),
    ("    if (i < n) { y[i] = x[i]; y[i] = __hadd(y[i], x[i]); }\n", "read after it is written"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_no_site_for_mixed_widths_or_a_buffer_passed_twice(transform):
    mixed = KernelState(source=HEAD.replace("__half* y", "float* y") + "    if (i < n) y[i] = __half2float(x[i]);\n}\n",
                        plan=PLAN)
    with pytest.raises(NotApplicable, match="__half or __nv_bfloat16"):
        transform.forward(mixed, SITE)
    twice = KernelState(source=golden("scale_in_place", "after").source,
                        plan=plan_of('"y", "y", { scalar = "a", type = "f32" }, { scalar = "n", type = "i32" }'))
    with pytest.raises(NotApplicable, match="one buffer twice"):
        transform.forward(twice, SITE)


# --- what the packs compute, on the CPU ---------------------------------------------------------------------

def _inputs(case: str, n: int) -> tuple[dict, dict, dict]:
    """(params, inputs, outputs) of a golden case for n elements."""
    generator = torch.Generator().manual_seed(n)
    if case == "axpy_half":
        x, y = (torch.randn(n, generator=generator).half() for _ in range(2))
        return {"n": n, "a": 0.75}, {"x": x, "y": y}, {"z": (torch.float16, n)}
    g, u = (torch.randn(n, generator=generator).bfloat16() for _ in range(2))
    return {"n": n}, {"g": g, "u": u}, {"out": (torch.bfloat16, n), "gate": (torch.bfloat16, n)}


def _emulated(tmp_path, case: str, sources: dict[str, KernelState]) -> list[str]:
    """Where the packed forms of `sources` compute other bits than the naive kernel (empty when nowhere), for
    sizes with and without a tail, on aligned and misaligned (shift 1) pointers."""
    naive = golden(case, "after")
    binaries = emulate.builds(tmp_path, {"naive": naive, **sources})
    differences = []
    for n in (5, 64, 2053):
        params, inputs, outputs = _inputs(case, n)
        for shift in (0, 1):
            binary, state = binaries["naive"]
            want = emulate.run(binary, tmp_path / f"naive-{n}-{shift}", state, params, inputs, outputs, shift)
            for name in sources:
                binary, state = binaries[name]
                got = emulate.run(binary, tmp_path / f"{name}-{n}-{shift}", state, params, inputs, outputs, shift)
                differences += [f"{name} n={n} shift={shift} {out}" for out in outputs
                                if not torch.equal(got[out].view(torch.int16), want[out].view(torch.int16))]
    return differences


@pytest.mark.parametrize("case", sampled(["axpy_half", "silu_mul_bf16"], keep=["silu_mul_bf16"]))
def test_the_packed_kernel_computes_the_naive_kernels_bits_on_the_cpu(case, tmp_path):
    assert _emulated(tmp_path, case, {"packed": golden(case, "before")}) == []


def test_the_emulation_sees_a_lane_out_of_place(tmp_path):
    """The check can fail: a pack whose lanes 1 and 2 trade places computes other bits, aligned or not."""
    packed = golden("axpy_half", "before")
    swapped = packed.source.replace("z8h[1] = ", "z8h[@] = ").replace("z8h[2] = ", "z8h[1] = ").replace(
        "z8h[@] = ", "z8h[2] = ")
    assert swapped != packed.source
    differences = _emulated(tmp_path, "axpy_half", {"swapped": KernelState(source=swapped, plan=packed.plan)})
    assert differences and all("shift=0" in d for d in differences), differences


BF16_PAIRS = KernelState(
    source="#include <cuda_bf16.h>\n"
           "__global__ void kernel(const __nv_bfloat16* x, const float* cos_t, const float* sin_t, __nv_bfloat16* y,\n"
           "                       int pairs) {\n"
           "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "    if (i >= pairs) return;\n"
           "    const float x0 = __bfloat162float(x[2 * i]), x1 = __bfloat162float(x[2 * i + 1]);\n"
           "    y[2 * i] = __float2bfloat16(x0 * cos_t[i] - x1 * sin_t[i]);\n"
           "    y[2 * i + 1] = __float2bfloat16(x0 * sin_t[i] + x1 * cos_t[i]);\n"
           "}\n",
    plan=plan_of('"x", "cos_t", "sin_t", "y", { scalar = "pairs", type = "i32" }', grid="cdiv(pairs, 256)"))


def test_bf16_pairs_pack_four_to_a_uint4_and_compute_the_naive_bits(transform, tmp_path, cache):
    """A rotary embedding on interleaved bf16 pairs: pair i at [2 * i] and [2 * i + 1], four pairs a pack; its
    cos and sin, float, gathered per pair. Pair counts with and without a tail, aligned and misaligned."""
    packed = transform.forward(BF16_PAIRS, SITE).state
    assert "if (i + 3 < pairs && (((size_t)x | (size_t)y) & 15) == 0) {" in packed.source
    assert "y8h[7] = __float2bfloat16(x0 * sin_t[(i + 3)] + x1 * cos_t[(i + 3)]);" in packed.source
    assert packed.plan.launches[0].grid[0] == "cdiv(cdiv(pairs, 256), 4)"
    assert_packs_are_128_bit(BF16_PAIRS, packed, cache)

    def inputs(pairs: int) -> tuple[dict, dict, dict]:
        generator = torch.Generator().manual_seed(pairs)
        return ({"pairs": pairs}, {"x": torch.randn(2 * pairs, generator=generator).bfloat16(),
                                   "cos_t": torch.randn(pairs, generator=generator),
                                   "sin_t": torch.randn(pairs, generator=generator)},
                {"y": (torch.bfloat16, 2 * pairs)})
    assert emulate.differences(tmp_path, BF16_PAIRS, {"packed": packed}, ((4,), (8,), (1027,)), inputs) == []
