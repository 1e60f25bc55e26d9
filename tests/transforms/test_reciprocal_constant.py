"""reciprocal_constant: a division by a floating constant becomes a product by its reciprocal, which nvcc folds."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from klineage.transforms._float_values import literal as _literal
from tests.cuda_tools import count, sass_opcodes
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["elementwise", "compound", "lanes", "integer"]
PLAN = plan_of('"x", "y", { scalar = "n", type = "i32" }')
REFUSED = r"""
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n, float s)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = x[i];
    y[i] = i / 6 + v / 8.0f + v / 0.125f + v / s + v / 1e-39f + v / 1e38f + v / 3.0L + 1.0f / 3.0f
         + v / static_cast<int>(3) + v / (6 / 4) + v / (3.0f - 3.0f) + v / __int2float_rn(3);
}
__global__ void widened(const float* __restrict__ x, float* __restrict__ y)
{
    const double d = x[threadIdx.x];
    y[threadIdx.x] = d / 3.0f + d / 3.0;
}
float host_side(float v) { return v / 3.0f; }
"""
# A product one ulp from the quotient is nothing to a float result but a whole step where the quotient is truncated
# or compared (`i / 2.5f` is exactly 2 at i = 5; 5 times the rounded reciprocal of 2.5 need not be).
TRUNCATED = r"""
__device__ int bucket(float q) { return (int)q; }
__device__ float twice(float q) { return q + q; }
__device__ float scaled(float q) { return q / 3.0f; }
__device__ int steps(float q) { return q / 3.0f; }
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int* __restrict__ k, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int whole = i / 2.5f;
    k[i] = (int)(i / 3.5f) + static_cast<int>(i / 4.5f) + bucket(i / 5.5f) + (i / 6.5f > 1.0f)
         + __float2int_rz(i / 7.5f);
    k[i] += i / 10.5f;
    float f = floorf(i / 8.5f) + (i / 9.5f ? 1.0f : 0.0f);
    f += twice(x[i] / 11.5f) + fmaxf(x[i] / 12.5f, 0.0f) + (x[i] > 0.0f ? x[i] / 13.5f : 0.0f);
    float4 w;
    w.x = x[i] / 14.5f;
    y[i] = f + whole + w.x + (float)(x[i] / 15.5f);
}
"""


@pytest.fixture(scope="module")
def reciprocal():
    return get("reciprocal_constant")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "reciprocal_constant" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("reciprocal_constant", case)


def test_one_site_per_divisor_covers_every_lane_and_the_tail(reciprocal):
    after = golden("lanes", "after")
    assert reciprocal.forward_sites(after) == [Anchor("kernel", "divisor", "float(10)"),
                                                Anchor("kernel", "divisor", "3.0f")]
    rewrite = reciprocal.forward(after, Anchor("kernel", "divisor", "float(10)"))
    assert rewrite.state.source.count("* (1 / float(10))") == 5 and "x[e] / 3.0f" in rewrite.state.source
    assert reciprocal.find(rewrite.state) == [Anchor("kernel", "divisor", "float(10)")]


def test_an_integer_divisor_of_a_float_takes_a_floating_one(reciprocal):
    """`v / 6` with v a float divides as floats: its reciprocal is `1.0f / 6` (`1 / 6` would be zero), a
    double's `1.0 / 6`; the product comes back to the division it was."""
    after = golden("integer", "after")
    source = after.source + "__device__ double half_again(double d) { return d / 6; }\n"
    state = KernelState(source=source, plan=PLAN)
    assert [(a.function, a.key) for a in reciprocal.forward_sites(state)] == [("kernel", "6"), ("half_again", "6")]
    forward = reciprocal.forward(state, Anchor("half_again", "divisor", "6")).state
    assert "return d * (1.0 / 6);" in forward.source
    assert reciprocal.backward(forward, Anchor("half_again", "divisor", "6")).state.source == source


def test_spelling_round_trips_byte_for_byte(reciprocal):
    tight = golden("elementwise", "after").source.replace("v * r6 / 6.0f", "v*r6/6.0f")
    state = KernelState(source=tight, plan=PLAN)
    (anchor,) = reciprocal.forward_sites(state)
    forward = reciprocal.forward(state, anchor).state
    assert "v*r6*(1 / 6.0f)" in forward.source
    assert reciprocal.backward(forward, anchor).state.source == tight


def test_an_experts_reciprocal_in_any_spelling_of_one_walks_back(reciprocal):
    expert = golden("elementwise", "before").source.replace("(1 / 6.0f)", "(1.0f / 6.0f)")
    state = KernelState(source=expert, plan=PLAN)
    (anchor,) = reciprocal.find(state)
    assert reciprocal.backward(state, anchor).state.source == golden("elementwise", "after").source
    not_one = KernelState(source=expert.replace("(1.0f / 6.0f)", "(2.0f / 6.0f)"), plan=PLAN)
    assert reciprocal.find(not_one) == []


def test_what_is_not_a_site(reciprocal):
    """An integer quotient (`i / 6`: integers divide as integers), powers of two (nvcc multiplies by those already),
    a runtime divisor, a reciprocal out of the normal range, a long double, a constant dividend (folded), a cast to
    an integer, an integer quotient, a zero divisor, a call; a float divisor of a double dividend (a float
    reciprocal would cut its precision) though the double one is a site; host code."""
    state = KernelState(source=REFUSED, plan=PLAN)
    assert reciprocal.forward_sites(state) == [Anchor("widened", "divisor", "3.0")]
    assert reciprocal.find(state) == []
    with pytest.raises(NotApplicable, match="no site dividing by 8.0f"):
        reciprocal.forward(state, Anchor("kernel", "divisor", "8.0f"))
    with pytest.raises(NotApplicable, match="needs a divisor anchor"):
        reciprocal.forward(state, Anchor("kernel", "call", "3.0"))


def test_a_quotient_truncated_or_compared_is_not_a_site(reciprocal):
    """Stored into an int, cast, rounded, compared, passed to an int helper or tested as a condition: no site.
    Kept floating through a float helper, a float math function, a conditional's branch, a float4 component, a
    float cast or a float function's return: a site."""
    sites = reciprocal.forward_sites(KernelState(source=TRUNCATED, plan=PLAN))
    assert [(a.function, a.key) for a in sites] == [
        ("scaled", "3.0f"), ("kernel", "11.5f"), ("kernel", "12.5f"), ("kernel", "13.5f"), ("kernel", "14.5f"),
        ("kernel", "15.5f")]


@pytest.mark.parametrize("text, kind, value", [
    ("6.0f", "float", 6.0), ("6.f", "float", 6.0), (".5", "double", 0.5), ("1e-3F", "float", 1e-3),
    ("0x1p-3f", "float", 0.125), ("-2.0", "double", -2.0), ("6", "int", 6.0), ("0x10u", "int", 16.0),
    ("017", "int", 15.0), ("1'000", "int", 1000.0), ("3.0L", None, None), ("08", None, None)])
def test_literals(text, kind, value):
    assert _literal(text) == ((kind, value) if kind else None)


@pytest.mark.parametrize("case", ["elementwise", "integer"])
def test_the_folded_reciprocal_replaces_the_division_in_sass(reciprocal, cache, case):
    """The division's refinement and slow-path call go; one multiply by the folded constant stays (`1.0f / 6` of
    an integer six as well as `1 / 6.0f`)."""
    naive, folded = (compiles_without_spills(golden(case, which), cache) for which in ("after", "before"))
    slow, fast = sass_opcodes(naive), sass_opcodes(folded)
    assert count(slow, r"^CALL") + count(slow, r"^MUFU\.RCP") >= 1
    assert count(fast, r"^CALL") + count(fast, r"^MUFU\.RCP") == 0
    assert sum(fast.values()) < sum(slow.values())


def test_products_stay_within_two_ulp_of_the_quotients_on_the_cpu(tmp_path):
    """Both forms of each case on the emulator: the product by the folded reciprocal is not always the rounded
    quotient (some outputs differ), but it is never more than 2 ulp from it."""
    for case in ("elementwise", "lanes"):
        forms = {name: KernelState(source=golden(case, which).source, plan=PLAN)
                 for name, which in (("quotient", "after"), ("product", "before"))}
        built = emulate.builds(tmp_path / case, forms)
        n = 4099
        x = torch.randn(n, generator=torch.Generator().manual_seed(7)) * 8
        got = {name: emulate.run(binary, tmp_path / case / name, state, {"n": n}, {"x": x},
                                 {"y": (torch.float32, n)})["y"] for name, (binary, state) in built.items()}
        ulps = (got["product"].view(torch.int32).long() - got["quotient"].view(torch.int32).long()).abs()
        assert 0 < int((ulps > 0).sum()) and int(ulps.max()) <= 2, (case, int(ulps.max()))


def test_a_division_of_a_loops_result_runs_once_for_its_loads_and_is_not_a_site(reciprocal):
    """A 3x3 window's mean divides once for nine loads: not worth a gate evaluation. Inside the loop, it is."""
    pooled = KernelState(source=r"""
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sum = 0.0f;
    for (int t = 0; t < 9; ++t) sum += x[9 * i + t] / 3.0f;
    y[i] = sum / 9.0f;
}
""", plan=PLAN)
    assert reciprocal.forward_sites(pooled) == [Anchor("kernel", "divisor", "3.0f")]
