"""serialize_reduction: one warp per row (lanes stride the row, shuffles combine the reductions) becomes one
thread per row; forward finds its sites by analysis on any kernel where the rewrite is legal."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load

CASES = ["softmax", "rowsum", "cumsum"]


@pytest.fixture(scope="module")
def transform():
    return get("serialize_reduction")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "serialize_reduction" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("serialize_reduction", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    naive = golden(case, "after")
    assert transform.forward_sites(naive) == [Anchor("kernel", "function", "row")]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(naive) == []


PLAN_TEXT = """
name = "t"
problem = "t"
[[launch]]
entry = "kernel"
grid = ["cdiv(rows, 128)"]
block = [128]
args = ["x", "y", { scalar = "rows", type = "i32" }, { scalar = "n", type = "i32" }]
"""
PLAN = LaunchPlan.from_toml(PLAN_TEXT)

HEAD = "__global__ void kernel(const float* x, float* y, int rows, int n) {\n" \
       "    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= rows) return;\n"


@pytest.mark.parametrize("body, why", [
    ("    float s = 1.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n    y[row] = s;\n", "zero"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) s += x[row * n + j];\n    s += 1.0f;\n    y[row] = s;\n",
     "outside"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row] = s; }\n", "index"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = y[row * n + j] * 2.0f;\n", "both stored"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) s = s * 0.5f + x[row * n + j];\n", "reduction"),
    ("    for (int j = 1; j < n; ++j) y[row * n + j] = x[row * n + j];\n", "unit-step"),
    ("    for (int j = 0; j < n; ++j) for (int k = 0; k < n; ++k) y[row * n + j] = x[k];\n", "no store or reduction"),
    ("    __shared__ float t[32];\n    for (int j = 0; j < n; ++j) y[row * n + j] = x[j];\n", "shares memory"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = x[row * n + j] + threadIdx.x;\n", "threadIdx"),
    ("    for (int j = 0; j < n; ++j) y[row * n + j] = foo(x[j]);\n", "calls foo"),
    ("    for (int j = 0; j < n; ++j) atomicAdd(y + row, x[row * n + j]);\n", "shares memory"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j]; y[row * n] = s; }\n",
     "loop index does not say"),
    ("    float s = 0.0f;\n    for (int j = 0; j < n; ++j) { s += x[row * n + j] * s; y[row * n + j] = s; }\n",
     "read inside its loop"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, Anchor("kernel", "function", "row"))


def test_no_site_when_a_warp_would_straddle_rows(transform):
    naive = golden("softmax", "after")
    plan = LaunchPlan.from_toml(PLAN_TEXT.replace("[128]", "[100]"))
    assert transform.forward_sites(KernelState(source=naive.source, plan=plan)) == []
    with pytest.raises(NotApplicable, match="no multiple of 32"):
        transform.forward(KernelState(source=naive.source, plan=plan), Anchor("kernel", "function", "row"))


def test_the_tail_of_a_row_is_the_loops_own_bound(transform):
    """n = 33: lane 0 takes columns 0 and 32, lanes 1..31 one column each: the strided loop keeps `j < n`."""
    rewritten = transform.forward(golden("softmax", "after"), Anchor("kernel", "function", "row")).state
    assert "for (int j = lane; j < n; j += 32)" in rewritten.source
    assert rewritten.plan.launches[0].grid[0] == "(cdiv(rows, 128)) * 32"
