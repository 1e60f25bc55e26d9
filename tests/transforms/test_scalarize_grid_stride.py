"""scalarize_grid_stride: a grid-stride loop that walks four elements a step as 16-byte vectors (a scalar tail, the
element loop where a pointer is misaligned) becomes the loop over elements; forward finds its sites by analysis."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

NAME = "scalarize_grid_stride"
CASES = ["mse", "max_abs", "dot_int", "scale_sum"]
SITE = Anchor("kernel", "function", "i")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "transfer" / "mse_loss" / "naive"


@pytest.fixture(scope="module")
def transform():
    return get(NAME)


def golden(case: str, which: str) -> KernelState:
    return load(HERE / NAME / case, which, "kernel")


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    check_golden(NAME, case)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_loop_by_analysis_and_backward_only_the_vector_form(transform, case):
    assert [a.key for a in transform.forward_sites(golden(case, "after"))] == ["i"]
    assert transform.forward_sites(golden(case, "before")) == []
    assert transform.find(golden(case, "after")) == []
    assert [a.key for a in transform.find(golden(case, "before"))] == ["i"]


def test_the_vector_loop_runs_to_a_quarter_and_the_tail_after_it(transform):
    vector = golden("mse", "before").source
    assert "if ((((size_t)pred | (size_t)target) & 15) == 0) {" in vector
    assert "for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < n / 4; v += stride) {" in vector
    assert "const float4 pred4 = reinterpret_cast<const float4*>(pred)[v];" in vector
    assert "for (int i = (n / 4) * 4 + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {" in vector
    wide = golden("dot_int", "before").source  # the 64-bit index kept, on the vector index too
    assert "for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < n / 4; v += (long long)" in wide


def _state(path: Path) -> KernelState:
    return KernelState(source=(path / "kernel.cu").read_text(), plan=LaunchPlan.from_toml((path / "launch.toml")
                                                                                          .read_text()))


def test_the_mse_loss_benchmark_is_a_site_before_and_after_its_atomics_are_aggregated(transform):
    """The naive kernel, and the one unaggregate_atomics' forward leaves (the search applies it first): the loop
    stays as written, the shuffles and the warp's atomic after it."""
    naive = _state(BENCH)
    assert [(a.function, a.key) for a in transform.forward_sites(naive)] == [("mse_loss", "i")]
    atomics = get("unaggregate_atomics")
    aggregated = atomics.forward(naive, atomics.forward_sites(naive)[0]).state
    sites = transform.forward_sites(aggregated)
    assert [(a.function, a.key) for a in sites] == [("mse_loss", "i")]
    vector = transform.forward(aggregated, sites[0]).state
    assert "__shfl_xor_sync" in vector.source and "const float4 b4 = " in vector.source
    assert transform.backward(vector, transform.find(vector)[0]).state == aggregated


def test_the_vector_form_compiles_to_128_bit_loads(cache):
    from tests.cuda_tools import feature_counts

    counts = feature_counts(compiles_without_spills(golden("mse", "before"), cache))
    assert counts.get("ldg_128", 0) >= 2, counts


# ---- refusals -----------------------------------------------------------------------------------------------------
PLAN = plan_of('"x", "y", "out", { scalar = "n", type = "i32" }', grid="64")
HEAD = "__global__ void kernel(const float* x, float* y, float* out, int n) {\n    float s = 0.0f;\n"
LOOP = "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {\n"
TAIL = "    }\n    atomicAdd(out, s);\n}\n"


def _kernel(body: str, loop: str = LOOP, head: str = HEAD) -> KernelState:
    return KernelState(source=head + loop + f"        {body}\n" + TAIL, plan=PLAN)


@pytest.mark.parametrize("body, why", [
    ("s += x[i]; __syncthreads();", r"synchronizes.*`__syncthreads`"),
    ("s += __shfl_xor_sync(0xffffffffu, x[i], 1);", "`__shfl_xor_sync`"),
    ("atomicAdd(out, x[i]);", "makes an atomic"),
    ("if (x[i] < 0.0f) break; s += x[i];", "`break`"),
    ("if (x[i] < 0.0f) return; s += x[i];", "`return`"),
    ("if (x[i] < 0.0f) continue; s += x[i];", "`continue`"),
    ("for (int k = 0; k < 2; ++k) s += x[i];", "`for`"),
    ("s += x[i] * threadIdx.x;", "`threadIdx`"),
    ("static float t = 0.0f; s += x[i];", "`static`"),
    ("s += x[i]; printf(\"%f\", s);", "`printf`"),
    ("y[i + 1] = x[i];", r"writes `y\[i \+ 1\]`"),
    ("y[i] = x[i]; s += y[i + 1];", r"reads `y\[i \+ 1\]`, not element i of a pointer parameter the kernel never"),
    ("s += x[i]; i += 1;", "writes or declares its index 'i'"),
    ("if (x[i] > 0.0f) y[i] = x[i];", "written only under a condition"),
    ("if (x[i] > 0.0f) y[i] = x[i]; else if (x[i] < -1.0f) y[i] = 0.0f;", "written only under a condition"),
    ("y[i] = s; s += x[i];", "reads or updates its accumulator 's'"),  # a per-thread prefix: the order shows
    ("if (x[i] > s) s = x[i];", "reads or updates its accumulator 's'"),  # an argmax-like update reads s
    ("s = x[i];", "other than as a reduction"),  # the last element a thread saw
    ("s = x[i] - s;", "other than as a reduction"),
    ("s += x[i]; s *= 0.5f;", "in two ways"),
    ("s += *x + x[i];", "dereferences a pointer expression"),
    ("s += x[i]; n = 0;", "assigns 'n' of its bound"),
])
def test_no_site_where_the_body_could_not_run_per_component(transform, body, why):
    state = _kernel(body)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("loop, why", [
    (LOOP.replace("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x"), "start at the global thread index"),
    (LOOP.replace("int i = blockIdx.x * blockDim.x + threadIdx.x", "int i = blockIdx.y * blockDim.y + threadIdx.y"),
     "start at the global thread index"),  # a loop over another dimension
    (LOOP.replace("i += blockDim.x * gridDim.x", "i += blockDim.x"), "step is not"),
    (LOOP.replace("i += blockDim.x * gridDim.x", "i += 2 * blockDim.x * gridDim.x"), "step is not"),
    (LOOP.replace("i < n", "i <= n - 2"), "condition is not `i < n`"),
    (LOOP.replace("i < n", "i < x[0]"), "bound is not a count"),
    (LOOP + "        s += x[i];\n    }\n" + LOOP, "more than one grid-stride loop"),
])
def test_no_site_for_a_loop_that_is_not_the_grids(transform, loop, why):
    state = _kernel("s += x[i];", loop=loop)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


@pytest.mark.parametrize("head, body, why", [
    ("__device__ float g;\n" + HEAD, "g += x[i];", "assigns 'g', which is no local declared before the loop"),
    (HEAD + "    float t = 0.0f;\n", "s += t; t += x[i];", "reads an accumulator"),
    (HEAD + "    float acc[2] = {0.0f, 0.0f};\n", "acc[0] += x[i];", r"writes `acc\[0\]`"),
    (HEAD + "    y[0] = 0.0f;\n", "y[i] = x[i];", "touches 'y', which its loop writes, outside the loop"),
    (HEAD + "    float x4 = 0.0f;\n", "s += x[i] + x4;", "names 'x4', which the vector form declares"),
    (HEAD.replace("const float* x", "const double* x"), "s += x[i];", "no pointer parameter to float, int or"),
    (HEAD, "s += x[i] + y[0]; y[i] = 1.0f;", r"reads `y\[0\]`, not element i"),
])
def test_no_site_for_what_the_kernel_does_around_the_loop(transform, head, body, why):
    state = _kernel(body, head=head)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


# max_abs's naive kernel in the `while` spelling, its index declared before the loop and stepped last
MAX_ABS_WHILE = """__global__ void kernel(const float* x, float* partial, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float m = 0.0f;
    while (i < n) {
        m = fmaxf(m, fabsf(x[i]));
        i += blockDim.x * gridDim.x;
    }
    partial[blockIdx.x * blockDim.x + threadIdx.x] = m;
}
"""


def test_the_while_spelling_is_forwarded_as_its_for_loop(transform):
    """The `while` spelling reads as the `for` loop (`_c_style`): the golden's vector form, but for its comment."""
    written = golden("max_abs", "after")
    spelled = KernelState(source=MAX_ABS_WHILE, plan=written.plan)
    (site,) = transform.forward_sites(spelled)
    assert transform.forward(spelled, site).state.source.splitlines() == \
        golden("max_abs", "before").source.splitlines()[1:]


@pytest.mark.parametrize("old, new, why", [
    ("blockIdx.x * blockDim.x + threadIdx.x] = m", "i] = m", "reads its index 'i' after the loop"),
    ("    float m = 0.0f;\n", "    float m = 0.0f;\n    i += 1;\n", "changes its index 'i' before the loop"),
])
def test_the_while_spelling_refuses_an_index_the_kernel_reads_or_changes_outside_the_loop(transform, old, new, why):
    written = KernelState(source=MAX_ABS_WHILE, plan=golden("max_abs", "after").plan)
    assert old in written.source
    state = KernelState(source=written.source.replace(old, new), plan=written.plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_a_body_local_may_not_reuse_the_name_of_a_local_before_the_loop(transform):
    """`{ float t = 0; } t = x[i];` would hide an update of the outer t that is no reduction."""
    state = _kernel("{ float t = 1.0f; s += t; } t = x[i];", head=HEAD + "    float t = 0.0f;\n")
    with pytest.raises(NotApplicable, match="declares 't' again"):
        transform.forward(state, SITE)


def test_the_start_reads_in_either_order(transform):
    """The start read in its canonical spelling (`_canonical.py`): the forward writes the same loop either way."""
    state = _kernel("s += x[i];", loop=LOOP.replace("blockIdx.x * blockDim.x + threadIdx.x",
                                                    "threadIdx.x + blockDim.x * blockIdx.x"))
    vector = transform.forward(state, SITE).state
    assert "for (int i = (n / 4) * 4 + blockIdx.x * blockDim.x + threadIdx.x; i < n;" in vector.source
    assert vector == transform.forward(_kernel("s += x[i];"), SITE).state
    assert transform.backward(vector, SITE).state.source == _kernel("s += x[i];").source


def test_a_read_through_the_read_only_cache_is_the_plain_read_it_vectorizes(transform):
    """`__ldg(&x[i])` reads what `x[i]` reads: the same site and the same vector loop."""
    plain = _kernel("s += x[i];")
    cached = _kernel("s += __ldg(&x[i]);")
    assert transform.forward_sites(cached) == transform.forward_sites(plain)
    assert transform.forward(cached, SITE).state == transform.forward(plain, SITE).state


def test_a_read_only_array_read_elsewhere_is_read_with_the_components_index(transform):
    state = _kernel("s += x[i] * x[0]; y[i] = x[i] - (i > 0 ? x[i - 1] : 0.0f);")
    vector = transform.forward(state, SITE).state.source
    assert "y4.z = x4.z - ((4 * v + 2) > 0 ? x[(4 * v + 2) - 1] : 0.0f);" in vector
    assert transform.backward(KernelState(vector, PLAN), SITE).state.source == state.source


# ---- the CPU emulator ---------------------------------------------------------------------------------------------
SIZES = ((0,), (3,), (4,), (1000,), (1001,))


def _dot(n: int) -> tuple[dict, dict, dict]:
    g = torch.Generator().manual_seed(n)
    return ({"n": n}, {"a": torch.randint(-100, 100, (n,), generator=g, dtype=torch.int32),
                       "b": torch.randint(-100, 100, (n,), generator=g, dtype=torch.int32)},
            {"out": (torch.int32, 1)})


def test_the_integer_dot_product_is_the_naive_kernels_on_the_cpu(tmp_path):
    """n = 0, 3, 4, 1000, 1001 on aligned pointers (the vector loop and its tail) and pointers one element off (the
    element loop): the same integer sum, bit for bit, on 3 blocks of 64 threads (some threads take two vectors)."""
    plan = plan_of('"a", "b", "out", { scalar = "n", type = "i32" }', grid="3", block=64)
    naive, vector = (KernelState(golden("dot_int", which).source, plan) for which in ("after", "before"))
    assert emulate.differences(tmp_path, naive, {"vector": vector}, SIZES, _dot) == []


def test_the_emulation_sees_a_component_read_twice(tmp_path):
    """The check can fail: a component that reads another's element sums other integers on the vector path."""
    plan = plan_of('"a", "b", "out", { scalar = "n", type = "i32" }', grid="3", block=64)
    wrong = golden("dot_int", "before").source.replace("acc += a4.z * b4.z;", "acc += a4.y * b4.z;")
    found = emulate.differences(tmp_path, KernelState(golden("dot_int", "after").source, plan),
                                {"vector": KernelState(wrong, plan)}, ((1000,),), _dot)
    assert found == ["vector 1000-0 out"], found  # aligned only: the misaligned run takes the element loop


def test_the_scaled_sum_writes_the_naive_bits_and_sums_within_tolerance(tmp_path):
    """y bit for bit (each element's own product; its last element, past n, never written), the float total within
    rounding: each thread sums other elements in another order."""
    plan = plan_of('"x", "y", "total", { scalar = "scale", type = "f32" }, { scalar = "n", type = "i32" }',
                   grid="3", block=64)
    forms = {which: KernelState(golden("scale_sum", which).source, plan) for which in ("after", "before")}
    binaries = emulate.builds(tmp_path, forms)
    for (n,) in SIZES:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        for shift in (0, 1):
            runs = {which: emulate.run(binary, tmp_path / f"{which}-{n}-{shift}", state,
                                       {"n": n, "scale": 0.5}, {"x": x},
                                       {"y": (torch.float32, n + 1), "total": (torch.float32, 1)}, shift,
                                       starting={"total": torch.zeros(1)})
                    for which, (binary, state) in binaries.items()}
            assert torch.equal(runs["before"]["y"].view(torch.int32), runs["after"]["y"].view(torch.int32))
            assert torch.allclose(runs["before"]["total"], runs["after"]["total"], rtol=1e-5, atol=1e-5), (n, shift)
            assert torch.allclose(runs["after"]["total"], 0.5 * x.double().sum().float().reshape(1), rtol=1e-4,
                                  atol=1e-4)


@pytest.mark.slow  # the integer dot product and the scaled sum emulate the vector loop by default
def test_the_while_spelled_maximum_is_the_naive_kernels_on_the_cpu(tmp_path):
    """A maximum does not depend on which thread saw which element, nor in which order: the maximum of the threads'
    partials, bit for bit (each thread's own partial differs: it saw other elements)."""
    plan = plan_of('"x", "partial", { scalar = "n", type = "i32" }', grid="3", block=64)
    forms = {"after": KernelState(MAX_ABS_WHILE, plan), "before": KernelState(golden("max_abs", "before").source, plan)}
    binaries = emulate.builds(tmp_path, forms)
    for (n,) in SIZES:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        for shift in (0, 1):
            runs = {which: emulate.run(binary, tmp_path / f"{which}-{n}-{shift}", state, {"n": n},
                                       {"x": x}, {"partial": (torch.float32, 3 * 64)}, shift)["partial"].max()
                    for which, (binary, state) in binaries.items()}
            assert torch.equal(runs["before"].view(torch.int32), runs["after"].view(torch.int32)), (n, shift)
            assert runs["after"] == (x.abs().max() if n else 0.0)


def test_a_store_on_both_branches_of_an_if_else_is_the_naive_kernels_on_the_cpu(tmp_path):
    """y[i] stored by each branch of an if/else is stored at every element: a site, whose vector loop writes the
    naive bits on aligned and misaligned pointers."""
    source = ("__global__ void kernel(const float* x, float* y, int n) {\n" + LOOP +
              "        if (x[i] > 0.5f) y[i] = x[i];\n        else y[i] = 0.5f * x[i] * x[i];\n    }\n}\n")
    plan = plan_of('"x", "y", { scalar = "n", type = "i32" }', grid="3", block=64)
    naive = KernelState(source, plan)
    (site,) = get("scalarize_grid_stride").forward_sites(naive)
    vector = get("scalarize_grid_stride").forward(naive, site).state
    assert "else y4.w = 0.5f * x4.w * x4.w;" in vector.source

    def inputs(n):
        return {"n": n}, {"x": torch.randn(n, generator=torch.Generator().manual_seed(n))}, {"y": (torch.float32, n)}

    assert emulate.differences(tmp_path, naive, {"vector": vector}, SIZES[1:], inputs) == []  # n = 0: no output
