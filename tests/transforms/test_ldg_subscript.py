"""ldg_subscript: an array read as `__ldg(&a[k])` is read as `a[k]`; forward finds, by analysis, the arrays of any
kernel that are read-only global data (const pointers never written through, no alias in the launch) and reads
them through the read-only cache."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.cuda_tools import feature_counts
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["row_scale", "table_lookup"]


@pytest.fixture(scope="module")
def transform():
    return get("ldg_subscript")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "ldg_subscript" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("ldg_subscript", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


def test_forward_sites_are_the_read_only_arrays(transform):
    """Parameters and the const locals that start at them; an array whose reads all use __ldg is no site."""
    assert [a.key for a in transform.forward_sites(golden("row_scale", "after"))] == ["w", "in"]
    assert [a.key for a in transform.forward_sites(golden("row_scale", "before"))] == ["w"]
    assert [a.key for a in transform.forward_sites(golden("table_lookup", "after"))] == ["table", "idx"]
    assert [a.key for a in transform.find(golden("row_scale", "before"))] == ["in"]


PLAN = plan_of('"x", "y", { scalar = "n", type = "i32" }')
KERNEL = """__global__ void kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
SITE = Anchor("kernel", "array", "x")


def test_a_pointer_without_restrict_reads_through_the_read_only_cache(transform, cache):
    """Without __restrict__ nvcc cannot prove that the stores to y miss x and loads x coherently; the plan passes
    distinct buffers, so __ldg(&x[i]) is legal and compiles to LDG...CONSTANT."""
    naive = KernelState(source=KERNEL, plan=PLAN)
    assert transform.forward_sites(naive) == [SITE]
    cached = transform.forward(naive, SITE).state
    assert "y[i] = 2.0f * __ldg(&x[i]);" in cached.source
    before, after = (feature_counts(compiles_without_spills(s, cache)).get("ldg_const", 0) for s in (naive, cached))
    assert before == 0 and after >= 1


@pytest.mark.parametrize("edit, why", [
    (("const float* x", "float* x"), "no pointer to a const type"),
    (("y[i] = 2.0f * x[i];", "y[i] = 2.0f * const_cast<float*>(x)[i];"), "casts const away"),
    (("y[i] = 2.0f * x[i];", "{ x = y; y[i] = 2.0f * x[i]; }"), "used other than"),
    (("y[i] = 2.0f * x[i];", "y[i] = 2.0f * *(&x[i]);"), "used other than"),
    (("__global__ void kernel", "__device__ void kernel"), "no kernel"),
])
def test_no_site_where_the_data_may_change_or_is_not_global(transform, edit, why):
    assert edit[0] in KERNEL
    state = KernelState(source=KERNEL.replace(*edit), plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("edit, keys", [
    (("y[i] = 2.0f * x[i];", "{ const float* p = x + 1; y[i] = p[i] + x[i]; float* q = y; q[i] = 0.0f; }"),
     ["x", "p"]),
    (("int i =", "__shared__ float t[256];\n    const float* s = t;\n    int i ="), ["x"]),
    (("y[i] = 2.0f * x[i];", "{ const float* p = y; y[i] = p[i] * x[i]; }"), ["x"]),
])
def test_const_locals_are_sites_only_over_read_only_global_data(transform, edit, keys):
    """A const local starting at a read-only parameter is a site; one over shared memory, or over an array the
    kernel writes, is not."""
    state = KernelState(source=KERNEL.replace(*edit), plan=PLAN)
    assert [a.key for a in transform.forward_sites(state)] == keys


def test_no_site_when_the_launch_passes_the_buffer_twice(transform):
    state = KernelState(source=KERNEL, plan=plan_of('"y", "y", { scalar = "n", type = "i32" }'))
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match="passes one buffer to it twice"):
        transform.forward(state, SITE)


def test_backward_restores_every_read_and_only_that_arrays(transform):
    both = transform.forward(golden("row_scale", "before"), Anchor("kernel", "array", "w")).state
    assert both.source.count("__ldg(") == 3
    undone = transform.backward(both, Anchor("kernel", "array", "in")).state
    assert undone.source.count("__ldg(&w[j])") == 1 and "__ldg(&in" not in undone.source


def test_backward_reads_an_array_indexed_by_its_own_cached_read_one_call_a_pass(transform):
    """`__ldg(&idx[__ldg(&idx[i])])`: the two reads' edits would overlap; the outer one goes first, the inner one
    on the next backward (the same `_edit.plain_read_edits` the analysis forwards read `__ldg` with)."""
    state = KernelState(source="__global__ void kernel(const int* __restrict__ idx, int* __restrict__ y, int n) {\n"
                               "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                               "    if (i < n) y[i] = __ldg(&idx[__ldg(&idx[i])]);\n}\n",
                        plan=plan_of('"idx", "y", { scalar = "n", type = "i32" }'))
    site = Anchor("kernel", "array", "idx")
    once = transform.backward(state, site).state
    assert "y[i] = idx[__ldg(&idx[i])];" in once.source
    assert "y[i] = idx[idx[i]];" in transform.backward(once, site).state.source
