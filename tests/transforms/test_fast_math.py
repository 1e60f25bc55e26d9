"""fast_math: one fast intrinsic (or one approximate asm instruction) becomes its precise function."""

from __future__ import annotations

import pytest

from klineage.corpus import kernel_entry, list_kernels
from klineage.features import cuda_parser as cp
from klineage.features.feature import Feature
from klineage.features.source import source_features
from klineage.transforms import Anchor, NotApplicable, get
from klineage.transforms.fast_math import PRECISE
from tests.sampled import sampled
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["expf", "fdividef", "asm"]
EVERY_INTRINSIC = r"""
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = x[i], b = x[i] + 2.0f;
    float s, c;
    __sincosf(a, &s, &c);
    y[i] = __expf(a) + __exp10f(a) + __logf(b) + __log2f(b) + __log10f(b) + __sinf(a) + __cosf(a) + __tanf(a)
         + __powf(b, a) + __fdividef(a, b) + s + c;
}
"""
ASM = r"""
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float e, l, s, c, t;
    asm volatile("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(x[i]));
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(l) : "f"(x[i] + 2.0f));
    asm("sin.approx.f32 %0, %1;" : "=f"(s) : "f"(x[i]));
    asm("cos.approx.f32 %0, %1;" : "=f"(c) : "f"(x[i]));
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(x[i]));
    y[i] = e + l + s + c + t;
}
"""


@pytest.fixture(scope="module")
def fast():
    return get("fast_math")


def golden(case: str, which: str):
    return load(HERE / "fast_math" / case, which, "kernel")


def strip(transform, state):
    while anchors := transform.find(state):
        rewrite = transform.backward(state, anchors[0])
        assert transform.forward(rewrite.state, anchors[0]).state.source == state.source
        state = rewrite.state
    return state


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("fast_math", case)


@pytest.mark.parametrize("case", sampled(CASES, keep=('asm',)))
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_anchors_and_carrier(fast):
    before = golden("expf", "before")
    # `expf(bias)` comes first and counts in the ordinal, so the rewrite keeps every key stable.
    assert fast.find(before) == [Anchor("kernel", "call", "__expf#1")]
    rewrite = fast.backward(before, Anchor("kernel", "call", "__expf#1"))
    assert rewrite.carrier == {"fast": "__expf", "precise": "expf"}
    assert rewrite.removes == ("fast_math",)
    assert fast.find(golden("asm", "before")) == [Anchor("kernel", "asm", "asm:ex2.approx.ftz.f32#0")]
    assert fast.find(golden("fdividef", "before")) == [Anchor("kernel", "call", "__fdividef#0")]


def test_every_intrinsic_maps_to_its_precise_function(fast, cache):
    state = golden("expf", "before").with_source(EVERY_INTRINSIC)
    assert len(fast.find(state)) == len(PRECISE) + 1  # and __fdividef
    assert Feature("kernel", "fast_math") in source_features(state.source)
    plain = strip(fast, state)
    for intrinsic, precise in PRECISE.items():
        assert intrinsic + "(" not in plain.source and precise + "(" in plain.source
    assert "((a) / (b))" in plain.source
    assert Feature("kernel", "fast_math") not in source_features(plain.source)
    compiles_without_spills(state, cache)
    compiles_without_spills(plain, cache)


def test_every_approximate_asm_instruction(fast, cache):
    state = golden("asm", "before").with_source(ASM)
    assert [a.key for a in fast.find(state)] == [
        "asm volatile:ex2.approx.f32#0", "asm:lg2.approx.ftz.f32#0", "asm:sin.approx.f32#0",
        "asm:cos.approx.f32#0", "asm:tanh.approx.f32#0"]
    plain = strip(fast, state)
    for line in ("e = exp2f(x[i]);", "l = log2f(x[i] + 2.0f);", "s = sinf(x[i]);", "c = cosf(x[i]);",
                 "t = tanhf(x[i]);"):
        assert line in plain.source
    assert Feature("kernel", "fast_math") not in source_features(plain.source)
    compiles_without_spills(plain, cache)


def test_asm_forward_is_canonical(fast):
    canonical = 'asm("ex2.approx.ftz.f32 %0, %1;"'
    loose = golden("asm", "before").source.replace(canonical, 'asm ("ex2.approx.ftz.f32 %0,%1;"')
    state = golden("asm", "before").with_source(loose)
    (anchor,) = fast.find(state)
    rewrite = fast.backward(state, anchor)
    assert rewrite.state.source == golden("asm", "after").source
    assert fast.forward(rewrite.state, anchor).state.source == golden("asm", "before").source


def test_other_asm_is_not_a_site(fast):
    state = golden("asm", "before")
    for other in ('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x[i]) : "memory");',
                  'asm("ex2.approx.ftz.f32 %0, %1;\\n\\tadd.f32 %0, %0, %0;" : "+f"(e) : "f"(x[i]));',
                  'asm("rcp.approx.f32 %0, %1;" : "=f"(e) : "f"(x[i]));'):
        source = state.source.replace('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x[i]));', other)
        assert other in source
        assert fast.find(state.with_source(source)) == []


def test_not_applicable_cases(fast):
    before, after = golden("expf", "before"), golden("expf", "after")
    with pytest.raises(NotApplicable, match="already the precise form"):
        fast.backward(before, Anchor("kernel", "call", "__expf#0"))
    with pytest.raises(NotApplicable, match="already fast"):
        fast.forward(before, Anchor("kernel", "call", "__expf#1"))
    with pytest.raises(NotApplicable, match="no site __expf#2 in kernel"):
        fast.backward(after, Anchor("kernel", "call", "__expf#2"))
    with pytest.raises(NotApplicable, match="__fmul_rn is not a fast-math intrinsic"):
        fast.backward(before, Anchor("kernel", "call", "__fmul_rn#0"))
    with pytest.raises(NotApplicable, match="rcp.approx.f32 is not an approximate instruction it knows"):
        fast.backward(before, Anchor("kernel", "asm", "asm:rcp.approx.f32#0"))
    with pytest.raises(NotApplicable, match="needs a call anchor"):
        fast.backward(before, Anchor("kernel", "call", "expf"))


@pytest.mark.parametrize("entry", [e.name for e in list_kernels()])
def test_every_fast_math_site_of_a_corpus_kernel_walks_back(entry, fast):
    """An expert may use fast-math intrinsics (logcumsumexp's block_scan does): each one the source
    feature sees is a site the walk removes, one at a time, down to a kernel with none left.
    (warp_vec4 computes exp as exp2f(fma(v, log2 e, -m2)), a precise function: nothing to remove.)"""
    state = kernel_entry(entry).load()
    sites = fast.find(state)
    assert bool(sites) == any(f.name == "fast_math" for f in source_features(state.source))
    for _ in range(len(sites)):
        state = fast.backward(state, fast.find(state)[0]).state
    assert fast.find(state) == []
    assert not [f for f in source_features(state.source) if f.name == "fast_math"]
    assert not cp.syntax_errors(state.source)


DIVISIONS = r"""
__device__ float sigmoid_of(float v) { return 1.0f / (1.0f + expf(-v)); }
__global__ void kernel(const float* __restrict__ x, const double* __restrict__ d, float* __restrict__ y,
                       int* __restrict__ k, int n, int cols, float beta)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    float sum = 0.0f;
    for (int j = 0; j < cols; ++j) sum += x[j] / beta;
    const float mean = sum / cols;
    k[i] = v / cols;
    y[i] = v / (1.0f + expf(-v)) + sigmoid_of(v) + v / beta + i / n + (float)(d[i] / 3.0) + v / 6.0f
         + ((v) / (beta)) + mean + (v / cols > 1.0f ? 1.0f : 0.0f);
}
"""


def test_any_float_division_is_a_forward_site(fast, cache):
    """Float divisions become __fdividef wherever the operands are single precision (or one an integer), the
    divisor no floating constant and the quotient stays floating and runs per element; every division of that
    text goes at once. Not sites: an int quotient, a double one, a constant divisor (reciprocal_constant's), the
    canonical `((v) / (beta))` (a call site of its own), a quotient stored into an int or compared, a row's mean
    after its loop."""
    state = golden("expf", "before").with_source(DIVISIONS)
    divisions = [a for a in fast.forward_sites(state) if a.kind == "division"]
    assert [(a.function, a.key) for a in divisions] == [
        ("sigmoid_of", "1.0f/(1.0f+expf(-v))"), ("kernel", "x[j]/beta"), ("kernel", "v/(1.0f+expf(-v))"),
        ("kernel", "v/beta")]
    assert Anchor("kernel", "call", "__fdividef#0") in fast.forward_sites(state)  # the canonical one
    assert [a for a in fast.forward_sites(state, {"fast": ["__expf"]}) if a.kind == "division"] == []
    assert [a.key for a in fast.forward_sites(state, {"fast": ["__fdividef"]}) if a.kind == "division"] == [
        a.key for a in divisions]
    rewrite = fast.forward(state, Anchor("kernel", "division", "v/(1.0f+expf(-v))"))
    assert "__fdividef(v, (1.0f + expf(-v)))" in rewrite.state.source and rewrite.carrier == {"fast": "__fdividef"}
    with pytest.raises(NotApplicable, match="no float division v/cols"):
        fast.forward(state, Anchor("kernel", "division", "v/cols"))
    compiles_without_spills(rewrite.state, cache)


def test_every_lane_of_a_division_goes_in_one_step(fast, cache):
    lanes = golden("expf", "before").with_source(r"""
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (i + 1 < n) {
        const float2 v = *reinterpret_cast<const float2*>(x + i);
        float2 w;
        { const float a = v.x; w.x = a / (1.0f + expf(-a)); }
        { const float a = v.y; w.y = a / (1.0f + expf(-a)); }
        *reinterpret_cast<float2*>(y + i) = w;
    } else {
        for (int e = i; e < n; ++e) { const float a = x[e]; y[e] = a / (1.0f + expf(-a)); }
    }
}
""")
    (site,) = [a for a in fast.forward_sites(lanes) if a.kind == "division"]
    fast_form = fast.forward(lanes, site).state
    assert fast_form.source.count("__fdividef(a, (1.0f + expf(-a)))") == 3 and " / " not in fast_form.source
    assert [a.key for a in fast.find(fast_form)] == ["__fdividef#0", "__fdividef#1", "__fdividef#2"]
    from tests.cuda_tools import count, sass_opcodes

    precise, approximate = (sass_opcodes(compiles_without_spills(s, cache)) for s in (lanes, fast_form))
    assert count(precise, r"^CALL") >= 1 and count(approximate, r"^CALL") == 0  # the division's slow path
    assert sum(approximate.values()) < sum(precise.values())


OVERLOADS = r"""
#include <cmath>
__global__ void kernel(const float* __restrict__ x, const double* __restrict__ d, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    y[i] = exp(v) + std::log(v + 1.0f) + pow(v, 2.0f) + (float)exp(d[i]) + (float)exp(d[i] * i) + expf(v)
         + (float)sin(2.0 * v) + (float)pow(v, 2) + exp(-v);
}
"""


def test_the_float_overloads_of_the_math_functions_are_sites(fast, cache):
    """`exp(v)`, `std::log(...)` and `pow(v, 2.0f)` on floats are CUDA's float overloads (expf, logf, powf) and
    become the intrinsics; the same names on a double, an int or a mixed pair are double functions, no site. Each
    spelling counts its own calls, so `expf`'s key keeps its number; the carrier's intrinsics choose them too."""
    state = golden("expf", "before").with_source(OVERLOADS)
    calls = [a.key for a in fast.forward_sites(state) if a.kind == "call"]
    assert calls == ["exp#0", "log#0", "pow#0", "__expf#0", "exp#1"]
    assert [a.key for a in fast.forward_sites(state, {"fast": ["__logf"]})] == ["log#0"]
    rewrite = fast.forward(state, Anchor("kernel", "call", "log#0"))
    assert "__logf(v + 1.0f)" in rewrite.state.source and rewrite.carrier == {"fast": "__logf"}
    rewrite = fast.forward(rewrite.state, Anchor("kernel", "call", "exp#1"))
    assert "+ __expf(-v);" in rewrite.state.source
    back = fast.backward(rewrite.state, Anchor("kernel", "call", "__expf#1"))  # the float function, by its name
    assert "+ expf(-v);" in back.state.source
    with pytest.raises(NotApplicable, match="no site exp#2"):
        fast.forward(state, Anchor("kernel", "call", "exp#2"))
    compiles_without_spills(rewrite.state, cache)


def test_a_division_by_a_float_overload_is_a_float_division(fast):
    """`v / (1.0f + exp(-v))`: exp of a float is the float overload, so the divisor reads as float and the
    division is a site; of a double, the division is a double one, no site."""
    state = golden("expf", "before").with_source(
        "__global__ void kernel(const float* x, const double* d, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) y[i] = x[i] / (1.0f + exp(-x[i])) + (float)(d[i] / (1.0 + exp(-d[i])));\n}\n")
    assert [a.key for a in fast.forward_sites(state) if a.kind == "division"] == ["x[i]/(1.0f+exp(-x[i]))"]
