"""Which calls the analysis forwards may move between threads, lanes and iterations (klineage/transforms/_calls.py):
the math library's, and a `__device__` helper of the same source whose definition shows it has no effect."""

from __future__ import annotations

import pytest

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import get
from klineage.transforms._calls import first_effect, pure_functions
from tests.transforms.golden import plan_of

PURE = [
    "__device__ __forceinline__ float sq(float v) { return v * v; }",
    "__device__ inline float gelu(const float v) { float c = 0.79788456f * (v + 0.044715f * v * v * v);\n"
    "    return 0.5f * v * (1.0f + tanhf(c)); }",
    "static __device__ float softplus(float v, float beta) { if (v * beta > 20.0f) return v;\n"
    "    return log1pf(expf(v * beta)) / beta; }",
    "__device__ float poly(float v) { float acc = 0.0f; for (int k = 0; k < 4; ++k) { acc = acc * v + 1.0f; }\n"
    "    return acc; }",
    "__constant__ float kCoeffs[4];\n__device__ float horner(float v) { float c[2] = {1.0f, 2.0f};\n"
    "    return c[0] + kCoeffs[1] * v; }",
]
IMPURE = [  # (definition, why it may have an effect)
    ("__device__ float bump(float* p) { *p += 1.0f; return *p; }", "a pointer parameter"),
    ("__device__ float& pick(float& v) { return v; }", "a reference parameter"),
    ("__device__ float tally(float v) { static float seen = 0.0f; seen += v; return seen; }", "static state"),
    ("__device__ float lane_scaled(float v) { return v * threadIdx.x; }", "a thread coordinate"),
    ("__device__ float add(float v) { atomicAdd(&v, 1.0f); return v; }", "an atomic"),
    ("__device__ float shout(float v) { printf(\"%f\", v); return v; }", "printf"),
    ("__device__ float g_total;\n__device__ float keep(float v) { g_total = v; return v; }", "a global assigned"),
    ("__device__ float table[4];\n__device__ float put(int k, float v) { table[k] = v; return v; }",
     "a store through a subscript"),
    ("__device__ float down(float v) { return v > 1.0f ? down(v * 0.5f) : v; }", "a call cycle"),
    ("__device__ float table[4];\n__device__ float peek(int k) { return table[k]; }",
     "reads device memory a kernel may write"),
    ("__managed__ float g_scale;\n__device__ float scaled(float v) { return v * g_scale; }",
     "reads managed memory a kernel may write"),
    ("__device__ float odd(float v);\n__device__ float even(float v) { return v > 1.0f ? odd(v - 1.0f) : v; }\n"
     "__device__ float odd(float v) { return v > 1.0f ? even(v - 1.0f) : -v; }", "a call cycle"),
    ("__device__ float via(float v) { return unknown_effect(v); }", "calls what it cannot see"),
    ("__device__ float same(float v) { return v; }\n__device__ float same(float* v) { *v = 0; return 0; }",
     "an overload with a pointer"),
    ("float host_only(float v) { return v; }", "not __device__"),
]


def _names(source: str) -> set[str]:
    return {f.name for f in cp.functions(cp.parse(source)) if not f.is_kernel}


@pytest.mark.parametrize("definition", PURE)
def test_a_helper_with_no_effect_is_pure(definition):
    assert pure_functions(cp.parse(definition)) == _names(definition)


@pytest.mark.parametrize("definition, why", IMPURE)
def test_a_helper_that_may_have_an_effect_is_not(definition, why):
    assert pure_functions(cp.parse(definition)) == frozenset(), why


def test_a_helper_calling_a_pure_helper_is_pure_and_one_calling_an_impure_one_is_not():
    source = PURE[0] + "\n" + IMPURE[0][0] + "\n" \
        "__device__ float norm2(float a, float b) { return sq(a) + sq(b); }\n" \
        "__device__ float worse(float a) { float t = a; return bump(&t); }\n"
    assert pure_functions(cp.parse(source)) == {"sq", "norm2"}
    parsed = cp.parse(source + "__global__ void k(float* y) { y[0] = norm2(1.0f, 2.0f) + worse(3.0f); }\n")
    kernel = next(f for f in cp.functions(parsed) if f.is_kernel)
    assert first_effect(parsed, kernel.node) == "worse"


PLAN = plan_of('"x", "y", { scalar = "n", type = "i32" }')
ELEMENTWISE = "__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {\n" \
              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = {call}(x[i]);\n}\n"


@pytest.mark.parametrize("helper, sites", [(PURE[1], 1), (IMPURE[0][0].replace("float* p", "float p")
                                                           .replace("*p", "p"), 1),
                                           (IMPURE[3][0], 0), (IMPURE[2][0], 0)])
def test_the_elementwise_forward_packs_a_kernel_calling_a_pure_helper_only(helper, sites):
    name = next(iter(_names(helper)))
    state = KernelState(source=helper + "\n" + ELEMENTWISE.replace("{call}", name), plan=PLAN)
    assert len(get("scalarize_elementwise").forward_sites(state)) == sites
