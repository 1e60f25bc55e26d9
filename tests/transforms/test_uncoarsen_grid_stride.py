"""uncoarsen_grid_stride: a grid-stride loop over elements on a grid shrunk by a factor becomes one element per
thread; forward finds its sites by analysis (both naive forms: `if (i < n) ...` and `if (i >= n) return; ...`),
rewrites the launch plan, and computes what the naive kernel computes (on the CPU emulator, every size a tail)."""

from __future__ import annotations

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

SITE = Anchor("kernel", "function", "i*4")


@pytest.fixture(scope="module")
def transform():
    return get("uncoarsen_grid_stride")


def golden(which: str, case: str = "leaky_relu") -> KernelState:
    return load(HERE / "uncoarsen_grid_stride" / case, which, "kernel")


@pytest.mark.parametrize("case", ["leaky_relu", "rotary"])
def test_golden(case):
    check_golden("uncoarsen_grid_stride", case)


@pytest.mark.parametrize("case", ["leaky_relu", "rotary"])
def test_golden_kernels_compile(cache, case):
    for which in ("before", "after"):
        compiles_without_spills(golden(which, case), cache)


# the rotary kernel as people write it: its pairs per token declared between the index and an early return
ROTARY = """// Rotary embedding on interleaved pairs, one thread per pair of x, cos and sin per (token, pair);
// the pairs per token a local of the parameters, which stays before the loop.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int tokens, int dim) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int half = dim / 2;
    if (i >= tokens * half) return;
    int t = i / half, p = i % half;
    float x0 = x[t * dim + 2 * p], x1 = x[t * dim + 2 * p + 1];
    float c = cos_t[t * half + p], s = sin_t[t * half + p];
    y[t * dim + 2 * p] = x0 * c - x1 * s;
    y[t * dim + 2 * p + 1] = x0 * s + x1 * c;
}
"""


def test_the_locals_between_the_index_and_the_guard_stay_before_the_loop(transform):
    naive = KernelState(source=ROTARY, plan=golden("after", "rotary").plan)
    assert transform.forward(naive, SITE).state.source == golden("before", "rotary").source


def test_a_local_of_the_index_before_the_guard_moves_into_the_loop(transform):
    naive = KernelState(source=HEAD + "    const float k = 0.5f;\n    int j = i ^ 1;\n    if (i >= n) return;\n"
                                      "    y[i] = k * x[j < n ? j : i];\n}\n", plan=PLAN)
    strided = transform.forward(naive, SITE).state.source
    assert ("    const float k = 0.5f;\n    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; "
            "i += gridDim.x * blockDim.x) {\n        int j = i ^ 1;\n        y[i] = k * x[j < n ? j : i];\n    }\n") \
        in strided


def test_forward_finds_the_naive_kernel_by_analysis_with_the_cards_factors(transform):
    assert transform.forward_sites(golden("after")) == [SITE]
    assert [a.key for a in transform.forward_sites(golden("after"), {"factor": [2, 8]})] == ["i*2", "i*8"]
    assert transform.forward_sites(golden("before")) == []
    assert transform.find(golden("before")) == [SITE]
    eight = transform.forward(golden("after"), Anchor("kernel", "function", "i*8")).state
    assert eight.plan.launches[0].grid[0] == "cdiv(cdiv(n, 256), 8)"


OUTER = """// out[r][c] = x[r] * w[c], a rows x cols outer product; one thread per output element.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                       int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    const int r = i / cols, c = i % cols;
    out[i] = x[r] * w[c];
}
"""
OUTER_PLAN = plan_of('"x", "w", "out", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                      "cdiv(rows * cols, 128)", 128)


def test_the_return_form_becomes_a_loop_over_the_rest_of_the_kernel(transform, cache):
    naive = KernelState(source=OUTER, plan=OUTER_PLAN)
    coarse = transform.forward(naive, SITE).state
    assert ("    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)rows * cols; "
            "i += gridDim.x * blockDim.x) {\n        const int r = i / cols, c = i % cols;\n") in coarse.source
    assert coarse.plan.launches[0].grid[0] == "cdiv(cdiv(rows * cols, 128), 4)"
    compiles_without_spills(coarse, cache)
    back = transform.backward(coarse, SITE).state  # the `if` form, which computes the same
    assert "    if (i < (long long)rows * cols) {\n" in back.source and back.plan == naive.plan


HEAD = "__global__ void kernel(const float* x, float* y, int n) {\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
PLAN = plan_of('"x", "y", { scalar = "n", type = "i32" }')


@pytest.mark.parametrize("body, why", [
    ("    if (i < n) { for (int k = 0; k < 4; ++k) y[i] += x[k]; }\n", "loops"),
    ("    if (i < n) { y[i] = x[i]; __syncthreads(); }\n", "synchronizes"),
    ("    if (i < n) y[i] = x[i] + threadIdx.x;\n", "thread coordinate"),
    ("    if (i < n) { y[i] = x[i]; i += 1; }\n", "changes its element index"),
    ("    if (i < n) y[i] = x[i];\n    y[0] = 1.0f;\n", "neither ends the kernel"),
    ("    if (i >= n) return;\n    y[i] = x[i] * gridDim.x;\n", "names gridDim"),
    ("    if (i < n && x[i] > 0.0f) y[i] = x[i];\n", "`i < n` or `i >= n`"),
    ("    if (i >= n) return;\n    y[i] = x[i];\n    n = 0;\n", "assigns 'n' of its bound"),  # read every step
    # a read of memory the launch writes: which element's write it sees would change (a `const` one moves inside)
    ("    const float w = y[0];\n    if (i < n) y[i] = w * x[i];\n", "memory the launch may write"),
    ("    float w = 2.0f;\n    if (i < n) { w = x[i]; y[i] = w; }\n", "is assigned"),
    ("    int lane = threadIdx.x % 32;\n    if (i < n) y[i] = x[i] * lane;\n", "name a thread coordinate"),
    ("    int old = atomicAdd((int*)y, 1);\n    if (i < n) y[i] = x[i];\n", "have an effect"),
    ("    int m = i + 1;\n    if (i < n - m) y[i] = x[i];\n", "local 'm' before the guard names the element"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, why):
    state = KernelState(source=HEAD + body + "}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_no_site_for_a_thread_coordinate_declared_before_the_index(transform):
    """Every iteration would read the thread's lane, not its element's."""
    state = KernelState(source=HEAD.replace("    int i", "    int lane = threadIdx.x % 32;\n    int i") +
                        "    if (i < n) y[i] = x[i] * lane;\n}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match="local 'lane' before the guard may read memory, have an effect or name"):
        transform.forward(state, SITE)


def test_no_site_on_a_two_dimensional_launch(transform):
    plan = LaunchPlan.from_toml((HERE / "uncoarsen_grid_stride" / "leaky_relu" / "after.toml").read_text().replace(
        'grid = ["cdiv(n, 256)"]', 'grid = ["cdiv(n, 256)", 2]'))
    with pytest.raises(NotApplicable, match="more than 1 dimension"):
        transform.forward(KernelState(source=golden("after").source, plan=plan), SITE)


# --- what the loop computes, on the CPU -------------------------------------------------------------------

@pytest.mark.parametrize("case", sampled(["leaky", "rotary", "outer"], keep=["leaky", "outer"]))
def test_the_loop_computes_the_naive_kernels_bits_on_the_cpu(transform, tmp_path, case):
    cases = {"leaky": (golden("after"), lambda n, g: ({"n": n}, {"x": torch.randn(n, generator=g)},
                                                       {"y": (torch.float32, n)})),
             "rotary": (golden("after", "rotary"),  # n tokens of 6 pairs: the local `half` before the loop
                        lambda n, g: ({"tokens": n, "dim": 12}, {"x": torch.randn(12 * n, generator=g),
                                                                 "cos_t": torch.randn(6 * n, generator=g),
                                                                 "sin_t": torch.randn(6 * n, generator=g)},
                                      {"y": (torch.float32, 12 * n)})),
             "outer": (KernelState(source=OUTER, plan=OUTER_PLAN),
                       lambda n, g: ({"rows": n, "cols": 3}, {"x": torch.randn(n, generator=g),
                                                              "w": torch.randn(3, generator=g)},
                                     {"out": (torch.float32, 3 * n)}))}
    naive, make = cases[case]
    forms = {"naive": naive, **{f"x{k}": transform.forward(naive, Anchor("kernel", "function", f"i*{k}")).state
                                 for k in (3, 4)}}
    binaries = emulate.builds(tmp_path, forms)
    for n in (1, 200, 1500):
        params, inputs, outputs = make(n, torch.Generator().manual_seed(n))
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}", state, params, inputs, outputs)
                for form, (binary, state) in binaries.items()}
        for form in ("x3", "x4"):
            for out in outputs:
                assert torch.equal(runs[form][out], runs["naive"][out]), (case, form, n, out)
