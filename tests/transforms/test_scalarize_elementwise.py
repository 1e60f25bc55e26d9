"""scalarize_elementwise: four elements per thread as 16-byte vectors (a scalar path for the tail and for
misaligned pointers) become one element per thread; forward finds its sites by analysis."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["scale", "scale_wide", "gelu_mul"]
SITE = Anchor("kernel", "function", "i")


@pytest.fixture(scope="module")
def transform():
    return get("scalarize_elementwise")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "scalarize_elementwise" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("scalarize_elementwise", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    assert [a.key for a in transform.forward_sites(golden(case, "after"))] == ["i"]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []


def test_the_vector_path_is_guarded_and_the_tail_is_scalar(transform):
    vector = transform.forward(golden("scale", "after"), SITE).state
    assert "if (i + 3 < n && (((size_t)x | (size_t)y) & 15) == 0) {" in vector.source
    assert "for (int e = i; e < n && e < i + 4; ++e) y[e] = a * x[e] + b;" in vector.source
    assert vector.plan.launches[0].grid[0] == "cdiv(cdiv(n, 256), 4)"


PLAN = LaunchPlan.from_toml("""
name = "t"
problem = "t"
[[launch]]
entry = "kernel"
grid = ["cdiv(n, 256)"]
block = [256]
args = ["x", "y", { scalar = "n", type = "i32" }]
""")
HEAD = "__global__ void kernel(const float* x, float* y, int n) {\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"


@pytest.mark.parametrize("body, why", [
    ("    if (i < n) y[i] = x[i + 1];\n", "not element i"),
    ("    if (i < n) y[i] = x[i] * i;\n", "beyond its subscripts"),
    ("    if (i < n && x[i] > 0) y[i] = x[i];\n", "guard is not"),
    ("    if (i < n) { if (x[i] > 0.0f) y[i] = x[i]; }\n", "only under a condition"),
    ("    if (i < n) atomicAdd(y, x[i]);\n", "loops, synchronizes"),
    ("    if (i < n) y[i] = foo(x[i]);\n", "calls foo"),
    ("    if (i < n) y[i] = *(x + i);\n", "beyond its subscripts"),
    ("    float s = 2.0f;\n    if (i < n) y[i] = s * x[i];\n", "between its element index"),
    ("    if (i < n) { y[i] = x[i]; y[i] = y[i] * 2.0f; }\n", "read after it is written"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_no_site_for_halves_or_a_buffer_passed_twice(transform):
    half = KernelState(source="#include <cuda_fp16.h>\n" + HEAD.replace("float*", "__half*") +
                       "    if (i < n) y[i] = x[i];\n}\n", plan=PLAN)
    with pytest.raises(NotApplicable, match="float, int or unsigned"):
        transform.forward(half, SITE)
    plan = (HERE / "scalarize_elementwise" / "scale" / "after.toml").read_text().replace('"y"', '"x"')
    twice = KernelState(source=golden("scale", "after").source, plan=LaunchPlan.from_toml(plan))
    with pytest.raises(NotApplicable, match="one buffer twice"):
        transform.forward(twice, SITE)
