"""unaggregate_atomics: a warp's atomic adds (maxima, minima), folded by shuffles and made once per warp, become one
atomic per thread; forward finds its sites by analysis, in the element form and in the tail form (each thread's own
sum added by one atomic every thread makes: the kernel's end for global memory, a block's shared sum read past a
barrier). Goldens, the sums and extremes on the CPU, and the kernels it refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from klineage.kernel import KernelState
from klineage.transforms import Anchor, NotApplicable, get
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["mse", "count", "tail_count", "block_sum", "absmax", "tail_min", "loop_count"]
SITE = Anchor("kernel", "function", "warp_total")
SITES = {"absmax": Anchor("kernel", "function", "warp_max"), "tail_min": Anchor("kernel", "function", "warp_min")}
ELEMENT_CASES = ("mse", "count", "absmax")  # the element form: one atomic an element, no loop


@pytest.fixture(scope="module")
def transform():
    return get("unaggregate_atomics")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unaggregate_atomics" / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden("unaggregate_atomics", case)


@pytest.mark.parametrize("case", CASES)
def test_golden_kernels_compile(case, cache):
    for which in ("before", "after"):
        compiles_without_spills(golden(case, which), cache)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    site = SITES.get(case, SITE)
    over_grid = [replace(site, key=f"{site.key}@grid")] if case in ELEMENT_CASES else []  # the element form's loop
    assert [replace(a, snippet="") for a in transform.forward_sites(golden(case, "after"))] == [
        replace(a, snippet="") for a in [*over_grid, site]]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []


def test_the_return_form_and_another_spelling_give_the_same_kernel(transform):
    naive = golden("count", "after")
    spelled = KernelState(source=naive.source.replace("blockIdx.x * blockDim.x + threadIdx.x",
                                                      "threadIdx.x + blockDim.x * blockIdx.x").replace(
        "    if (i < n) {\n        if (x[i] > threshold) atomicAdd(&count[0], 1);\n    }",
        "    if (i >= n) return;\n    if (x[i] > threshold) atomicAdd(&count[0], 1);"), plan=naive.plan)
    assert spelled.source != naive.source
    assert transform.forward(spelled, SITE).state.source == golden("count", "before").source


def _inputs(case: str, n: int) -> tuple[dict, dict, dict, dict]:
    """(params, inputs, outputs, the outputs' starting values: the sums start from zero)."""
    generator = torch.Generator().manual_seed(n)
    if case == "mse":
        a, b = (torch.randn(n, generator=generator) for _ in range(2))
        return {"n": n}, {"a": a, "b": b}, {"out": (torch.float32, 1)}, {"out": torch.zeros(1)}
    if case == "absmax":
        x = torch.randn(n, generator=generator)
        return {"n": n}, {"x": x}, {"out": (torch.int32, 1)}, {"out": torch.zeros(1, dtype=torch.int32)}
    if case == "tail_min":  # about one element in 50 exceeds the threshold: some slices hold none
        x = torch.randn(n, generator=generator)
        return ({"n": n, "threshold": 2.0}, {"x": x}, {"out": (torch.int64, 1)},
                {"out": torch.full((1,), n, dtype=torch.int64)})
    x = torch.randint(-100, 100, (n,), generator=generator, dtype=torch.int32)
    return ({"n": n, "threshold": 7}, {"x": x}, {"count": (torch.int32, 1)},
            {"count": torch.zeros(1, dtype=torch.int32)})


def _sums(tmp_path, case: str, state: KernelState) -> list:
    binary = emulate.build(tmp_path / "bin", state)
    found = []
    for n in (1, 5, 64, 2053):
        params, inputs, outputs, starting = _inputs(case, n)
        for shift in (0, 1):
            [result] = emulate.run(binary, tmp_path / f"{n}-{shift}", state, params, inputs, outputs, shift,
                                   starting=starting).values()
            found.append(result)
    return found


@pytest.mark.parametrize("case", sampled(CASES, keep=["count", "tail_count", "absmax", "tail_min", "loop_count"]))
def test_the_warp_sums_add_up_to_the_naive_sums_on_the_cpu(tmp_path, case):
    """The integer counts, maxima and minima are exact; the float mean differs only by the rounding of another order
    of adds. The tail form's grid (at most 4 blocks) makes the threads of n = 2053 stride."""
    naive, aggregated = (_sums(tmp_path / which, case, golden(case, which)) for which in ("after", "before"))
    assert all(torch.isfinite(want).all() for want in naive)
    for want, got in zip(naive, aggregated, strict=True):
        if case != "mse":
            assert torch.equal(got, want)
        else:
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_sums_see_a_butterfly_that_misses_a_lane(tmp_path):
    """The check can fail: a butterfly starting at offset 8 leaves each half-warp's sum apart, and lane 0 adds only
    its half's."""
    aggregated = golden("count", "before")
    short = KernelState(source=aggregated.source.replace("int offset = 16", "int offset = 8"), plan=aggregated.plan)
    assert short.source != aggregated.source
    naive, wrong = (_sums(tmp_path / name, "count", state)
                    for name, state in (("naive", golden("count", "after")), ("short", short)))
    assert any(not torch.equal(a, b) for a, b in zip(naive, wrong, strict=True))


PLAN = plan_of('"x", "out", { scalar = "n", type = "i32" }')
HEAD = ("__global__ void kernel(const float* x, float* out, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n")
TAIL = "    float s = 0;\n    for (int k = i; k < n; k += blockDim.x * gridDim.x) {loop}\n    {add}\n"


@pytest.mark.parametrize("body, plan, why", [
    ("    if (i < n) atomicAdd(out, x[i]);\n", plan_of('"x", "out", { scalar = "n", type = "i32" }', block=100),
     "no whole number of warps"),
    ("    if (i < n) atomicAdd(&out[i % 4], x[i]);\n", PLAN, "names more than its parameters"),
    ("    if (i < n) { atomicAdd(out, x[i]); atomicAdd(out + 1, 1.0f); }\n", PLAN, "add to 2 places"),
    ("    if (i < n) { float old = atomicAdd(out, x[i]); }\n", PLAN, "uses one's old value"),
    ("    if (i < n) { atomicAdd(out, x[i]); atomicMax((int*)out, 1); }\n", PLAN, "atomics of two kinds"),
    ("    if (i < n) atomicMax(out, x[i]);\n", PLAN, "'out' points to float, which atomicMax does not take"),
    ("    if (i < n) atomicExch(out, x[i]);\n", PLAN, "makes no atomicAdd, atomicMax or atomicMin"),
    ("    if (i < n) atomicAdd(out, x[i] + out[1]);\n", PLAN, "touches 'out' beyond its atomic adds"),
    ("    if (i < n) y[i] = x[i];\n", PLAN, "makes no atomicAdd"),
    # the tail form: each thread's sum over a stride of the grid, added last
    (TAIL.format(loop="{ if (x[k] < 0) return; s += x[k]; }", add="atomicAdd(out, s);"), PLAN,
     "can leave before its atomicAdd"),
    (TAIL.format(loop="s += x[k];", add="atomicAdd(out, s);"),
     plan_of('"x", "out", { scalar = "n", type = "i32" }', block=100), "no whole number of warps"),
    (TAIL.format(loop="{ s += x[k]; atomicAdd(out + 1, 1.0f); }", add="atomicAdd(out, s);"), PLAN,
     "makes atomics besides its atomicAdd"),
    (TAIL.format(loop="s += x[k];", add="atomicAdd(&out[threadIdx.x % 4], s);"), PLAN,
     "names more than its parameters"),
    (TAIL.format(loop="s += x[k] + out[1];", add="atomicAdd(out, s);"), PLAN, "touches 'out' beyond its atomic adds"),
    (TAIL.format(loop="s += x[k];", add="if (s > 0) atomicAdd(out, s);"), PLAN,
     "nor does its body make an atomicAdd, atomicMax or atomicMin that every thread makes"),
    (TAIL.format(loop="s += x[k];", add="atomicAdd(out, s);\n    out[1] = 0.0f;"), PLAN, "goes on after"),
    (TAIL.format(loop="s += x[k];", add="atomicAdd(out, s);\n    s = 0;"), PLAN, "goes on after its atomicAdd"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, plan, why):
    state = KernelState(source=HEAD + body + "}\n", plan=plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


ROW_COUNTS = """__global__ void kernel(const int* x, int* count, int rows, int cols) {
    int c_count = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) c_count += x[blockIdx.x * cols + c] > 7;
    atomicAdd(&count[blockIdx.x], c_count);
}
"""


def test_a_block_per_row_sum_on_the_blocks_index_is_one_place_for_a_warp(transform, tmp_path):
    """Each row's count added at `&count[blockIdx.x]`: every lane of a warp is in one block, so the warp's total goes
    there once; per row, the integer counts are the naive kernel's on the CPU."""
    plan = plan_of('"x", "count", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }',
                   grid="rows", block=128)
    naive = KernelState(source=ROW_COUNTS, plan=plan)
    (site,) = transform.forward_sites(naive)
    aggregated = transform.forward(naive, site).state
    assert "atomicAdd(&count[blockIdx.x], warp_total);" in aggregated.source
    forms = {name: (emulate.build(tmp_path / name, state), state)
             for name, state in (("naive", naive), ("aggregated", aggregated))}
    for rows, cols in ((3, 1), (5, 300), (2, 1000)):
        x = torch.randint(-100, 100, (rows * cols,), generator=torch.Generator().manual_seed(cols), dtype=torch.int32)
        params, inputs = {"rows": rows, "cols": cols}, {"x": x}
        outputs, starting = {"count": (torch.int32, rows)}, {"count": torch.zeros(rows, dtype=torch.int32)}
        want, got = (emulate.run(binary, tmp_path / f"{name}-{rows}", state, params, inputs, outputs, 0,
                                 starting=starting)["count"] for name, (binary, state) in forms.items())
        assert torch.equal(got, want) and int(want.sum()) == int((x > 7).sum())


BLOCK = ("__global__ void kernel(const int* x, int* y, int rows, int cols) {\n    __shared__ int row_sum[4];\n"
         "    if (threadIdx.x == 0) row_sum[0] = 0;\n    __syncthreads();\n    int part = 0;\n"
         "    for (int j = threadIdx.x; j < cols; j += blockDim.x) part += x[blockIdx.x * cols + j];\n"
         "    ADD\n    __syncthreads();\n    y[blockIdx.x * cols + threadIdx.x] = row_sum[0];\n}\n")
BLOCK_PLAN = plan_of('"x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }', grid="rows",
                     block=128)


@pytest.mark.parametrize("add, why", [
    ("atomicAdd(&row_sum[threadIdx.x % 4], part);", "names more than its shared variable"),  # a place a lane
    ("atomicAdd(&row_sum[part & 3], part);", "names more than its shared variable"),
    ("atomicAdd(&row_sum[0], part);\n    y[0] = row_sum[0];", "touches 'row_sum' after its atomicAdd before a barrier"),
    ("if (part > 0) atomicAdd(&row_sum[0], part);", "nor does its body make an atomicAdd"),
    ("atomicAdd(&row_sum[0], part);\n    atomicMax(&row_sum[1], part);", "makes atomics besides its atomicMax"),
    ("rows = 2;\n    atomicAdd(&row_sum[rows], part);", "assigns 'rows'"),
])
def test_no_site_where_a_blocks_shared_sum_is_not_one_place_read_past_a_barrier(transform, add, why):
    state = KernelState(source=BLOCK.replace("ADD", add), plan=BLOCK_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_a_blocks_shared_sum_made_by_a_warp_each_is_the_naive_sum_on_the_cpu(tmp_path):
    """The block_sum golden: every row's elements scaled by the row's sum, which a lane of each warp adds to the
    shared total; the integer rows are the naive kernel's, over rows shorter than a warp and several strides long.
    A warp's atomic moved past the barrier would be caught: the sum is read before all warps have added."""
    naive, aggregated = golden("block_sum", "after"), golden("block_sum", "before")
    warp_add = "    if (threadIdx.x % 32 == 0) atomicAdd(&row_sum, warp_total);\n"
    early = KernelState(source=aggregated.source.replace(warp_add + "    __syncthreads();\n",
                                                         "    __syncthreads();\n" + warp_add), plan=aggregated.plan)
    assert early.source != aggregated.source
    runs = {}
    for form, (binary, state) in emulate.builds(tmp_path, {"naive": naive, "warp": aggregated,
                                                           "early": early}).items():
        for rows, cols in ((3, 5), (2, 300)):
            x = torch.randint(-9, 10, (rows * cols,), generator=torch.Generator().manual_seed(cols), dtype=torch.int32)
            runs[form, cols] = emulate.run(binary, tmp_path / f"{form}-{cols}", state, {"rows": rows, "cols": cols},
                                           {"x": x}, {"y": (torch.int32, rows * cols)})["y"]
            if form == "naive":
                assert torch.equal(runs[form, cols], x * x.view(rows, cols).sum(1).repeat_interleave(cols))
    assert all(torch.equal(runs["warp", cols], runs["naive", cols]) for cols in (5, 300))
    assert any(not torch.equal(runs["early", cols], runs["naive", cols]) for cols in (5, 300))


@pytest.mark.parametrize("case", ["count", "tail_count"])
def test_backward_reads_no_warp_atomic_into_global_memory_that_code_follows(transform, case):
    """Forward makes the warp's atomic into global memory last in the kernel (only a shared sum may be read on past
    a barrier): with a statement after it, backward finds no form of its own to serialize."""
    aggregated = golden(case, "before")
    assert transform.find(aggregated) == [SITE]
    followed = KernelState(source=aggregated.source[:aggregated.source.rindex("}")] + "    __syncthreads();\n}\n",
                           plan=aggregated.plan)
    assert transform.find(followed) == []


NEGATIVE = """__global__ void kernel(const int* x, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicMax(out, x[i] - 1000);
}
"""


def test_a_warps_maximum_starts_at_the_least_int(transform, tmp_path):
    """Every value is negative, so a warp whose total started at 0 rather than int's least value would make its
    atomic with 0, above every value: the emulated maxima of the naive and the aggregated kernels agree, over a
    ragged last warp and warps that hold no element, and the start at 0 is caught."""
    naive = KernelState(source=NEGATIVE, plan=plan_of('"x", "out", { scalar = "n", type = "i32" }', block=128))
    _, site = transform.forward_sites(naive)  # the plain fold, after the one over a grid the GPU's size
    aggregated = transform.forward(naive, site).state
    assert "int warp_max = (-2147483647 - 1);" in aggregated.source
    at_zero = KernelState(source=aggregated.source.replace("(-2147483647 - 1);", "0;"), plan=aggregated.plan)
    least = torch.full((1,), -2**31, dtype=torch.int32)
    runs = {}
    for form, (binary, state) in emulate.builds(tmp_path, {"naive": naive, "warp": aggregated}).items():
        for n in (1, 70, 300):
            x = torch.randint(0, 999, (n,), generator=torch.Generator().manual_seed(n), dtype=torch.int32)
            runs[form, n] = emulate.run(binary, tmp_path / f"{form}-{n}", state, {"n": n}, {"x": x},
                                        {"out": (torch.int32, 1)}, starting={"out": least})["out"]
            if form == "naive":
                assert int(runs[form, n]) == int(x.max()) - 1000
    binary = emulate.build(tmp_path / "zero", at_zero)
    wrong = emulate.run(binary, tmp_path / "zero-70", at_zero, {"n": 70}, {"x": torch.zeros(70, dtype=torch.int32)},
                        {"out": (torch.int32, 1)}, starting={"out": least})["out"]
    assert all(torch.equal(runs["warp", n], runs["naive", n]) for n in (1, 70, 300))
    assert int(wrong) == 0


WHILE_MAX = """__global__ void kernel(const int* x, int* out, int n) {
    int stride = gridDim.x * blockDim.x;
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    while (i < n) {
        if (x[i] % 3 == 0) atomicMax(out, x[i]);
        i += stride;
    }
}
"""


def test_the_loop_form_keeps_its_loop_and_grid(transform, tmp_path):
    """A grid-stride loop folds every element a thread visits into its total (the `while` spelling, a maximum):
    the loop and the capped grid stay, and the maxima are the naive kernel's on the CPU over threads that stride
    several times and warps that find nothing."""
    plan = plan_of('"x", "out", { scalar = "n", type = "i32" }', grid="min(cdiv(n, 128), 2)", block=128)
    naive = KernelState(source=WHILE_MAX, plan=plan)
    (site,) = transform.forward_sites(naive)
    folded = transform.forward(naive, site).state
    assert site.key == "warp_max" and folded.plan == naive.plan
    # the `while` loop read as its `for` loop (`_c_style`), which the forward writes
    assert "    int warp_max = (-2147483647 - 1);\n    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; " \
           "i += stride) {" in folded.source
    unfolded = transform.backward(folded, transform.find(folded)[0]).state.source
    assert "if (x[i] % 3 == 0) atomicMax(out, x[i]);" in unfolded and "warp_max" not in unfolded
    least = torch.full((1,), -2**31, dtype=torch.int32)
    for form, (binary, state) in emulate.builds(tmp_path, {"naive": naive, "folded": folded}).items():
        for n in (5, 1000):
            x = torch.randint(-500, 500, (n,), generator=torch.Generator().manual_seed(n), dtype=torch.int32)
            got = emulate.run(binary, tmp_path / f"{form}-{n}", state, {"n": n}, {"x": x}, {"out": (torch.int32, 1)},
                              starting={"out": least})["out"]
            divisible = x[x % 3 == 0]
            assert int(got) == (int(divisible.max()) if len(divisible) else -2**31), (form, n)


@pytest.mark.parametrize("body, why", [
    ("{ if (x[i] < 0) return; atomicAdd(out, x[i]); }", "loop can leave the kernel"),
    ("{ atomicAdd(out, x[i]); atomicMin((int*)out, 1); }", "atomics of two kinds"),
])
def test_no_loop_form_where_a_lane_leaves_or_the_atomics_mix(transform, body, why):
    state = KernelState(source="__global__ void kernel(const float* x, float* out, int n) {\n"
                               "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                               f"i += blockDim.x * gridDim.x) {body}\n}}\n", plan=PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("case", ["count", "absmax"])
def test_the_element_form_over_a_grid_the_gpus_size_folds_the_naive_result(transform, case, tmp_path):
    """`warp_total@grid`: the element form's work in a grid-stride loop on min(its grid, num_sms * blocks an SM
    holds), each thread folding several elements before the warp's one atomic. On one SM of 16 blocks of 128 the
    threads of n = 5000 stride twice or more: the counts and maxima are the naive kernel's."""
    naive = golden(case, "after")
    site = SITES.get(case, SITE)
    folded = transform.forward(naive, replace(site, key=f"{site.key}@grid")).state
    assert folded.plan.launches[0].grid[0] == "min(cdiv(n, 128), num_sms * 16)"
    assert "i < n; i += blockDim.x * gridDim.x) " in folded.source
    assert transform.find(folded) == [replace(transform.find(folded)[0], key=site.key)]  # read as the loop form
    binaries = emulate.builds(tmp_path, {"naive": naive, "folded": folded})
    for n in (5, 5000):
        params, inputs, outputs, starting = _inputs(case, n)
        runs = {form: emulate.run(binary, tmp_path / f"{form}-{n}", state, {**params, "num_sms": 1}, inputs, outputs,
                                  starting=starting) for form, (binary, state) in binaries.items()}
        assert torch.equal(runs["folded"]["out" if case == "absmax" else "count"],
                           runs["naive"]["out" if case == "absmax" else "count"]), n
