"""reroll_grid_stride: a grid-stride loop unrolled U grids a step, each element under its own guard, becomes the
plain loop; forward finds its sites by analysis, writes every thread's loop of the kernel in that form (the same
elements in the same order), and refuses with the reason the loops it cannot unroll so."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.kernel import KernelState, load_kernel
from klineage.transforms import NotApplicable, get, refusals
from tests.gpu_tools import forwarded
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

MSE = Path(__file__).resolve().parents[2] / "bench" / "transfer" / "mse_loss"
ARGS = '"x", "out", { scalar = "n", type = "i32" }'


@pytest.fixture(scope="module")
def transform():
    return get("reroll_grid_stride")


@pytest.mark.parametrize("case", ["dot", "axpy"])
def test_golden(case):
    check_golden("reroll_grid_stride", case)


@pytest.mark.parametrize("case", ["dot", "axpy"])
def test_golden_kernels_compile(cache, case):
    for which in ("before", "after"):
        compiles_without_spills(load(HERE / "reroll_grid_stride" / case, which, "kernel"), cache)


def test_the_carrier_names_the_factors_else_two_grids_a_step(transform):
    after = load(HERE / "reroll_grid_stride" / "dot", "after", "kernel")
    assert [site.key for site in transform.forward_sites(after)] == ["loops*2"]
    assert [site.key for site in transform.forward_sites(after, {"factor": [4, 1, 4, 8]})] == ["loops*4", "loops*8"]
    four = transform.forward(after, transform.forward_sites(after, {"factor": [4]})[0])
    assert four.carrier == {"factor": 4} and "v_base += 4 * (blockDim.x * gridDim.x)" in four.state.source
    assert transform.backward(four.state, four.anchor).state.source == after.source
    with pytest.raises(NotApplicable, match="unrolled 2 grids a step"):
        transform.backward(four.state, transform.forward_sites(after)[0])


def _mse_vectors() -> KernelState:
    """mse_loss's naive kernel after the two forwards its search takes (its float4 loop, tail and fallback)."""
    return forwarded(forwarded(load_kernel(MSE / "naive"), "unaggregate_atomics"), "scalarize_grid_stride")


def test_forward_unrolls_the_held_out_mse_loss_loops_after_the_searchs_steps(transform):
    """mse_loss (bench/transfer, never walked) after the two forwards its search takes: the float4 loop, its tail
    and the unaligned fallback, each two grids a step (a full step and a guarded last step each); the plan is
    unchanged."""
    state = _mse_vectors()
    (site,) = transform.forward_sites(state)
    rewrite = transform.forward(state, site)
    assert rewrite.state.source.count("#pragma unroll") == 6 and rewrite.state.plan == state.plan
    assert "const int v = v_base + v_step * (blockDim.x * gridDim.x);" in rewrite.state.source


def test_nvcc_keeps_the_unrolled_loads_apart_in_the_machine_code(transform, cache):
    """Unrolled two grids a step, mse_loss's float4 loop, its tail and fallback each load two elements a full step
    and two more in the guarded last step: four times the plain loops' loads in SASS, none folded back into one."""
    from tests.cuda_tools import feature_counts

    state = _mse_vectors()
    unrolled = transform.forward(state, transform.forward_sites(state)[0]).state
    plain, twice = (feature_counts(compiles_without_spills(s, cache)) for s in (state, unrolled))
    assert (plain["ldg_128"], plain["ldg_32"]) == (2, 4) and (twice["ldg_128"], twice["ldg_32"]) == (8, 16)


def _loads_before_a_branch(instructions: list[str]) -> int:
    """The longest run of global loads with no branch between them."""
    longest = run = 0
    for op in instructions:
        if op.startswith("LDG"):
            run += 1
            longest = max(longest, run)
        elif op.startswith(("BRA", "BSSY", "BSYNC", "CALL", "RET")):
            run = 0
    return longest


def test_a_full_step_issues_its_loads_together_where_the_work_branches_on_the_value(transform, cache):
    """softplus (bench/transfer) branches on each element's value. nvcc unrolls its plain loop two elements a step
    itself; four grids a step, the full step's four loads are issued with no branch between them, where guarding
    each element would keep every load behind the branches of the element before it."""
    from tests.cuda_tools import sass_instructions

    plain = load_kernel(MSE.parent / "softplus" / "naive")
    four = transform.forward(plain, transform.forward_sites(plain, {"factor": [4]})[0]).state
    runs = [_loads_before_a_branch(sass_instructions(compiles_without_spills(s, cache), "sm_90"))
            for s in (plain, four)]
    assert runs == [2, 4]


def _refusal(transform, source: str) -> str:
    with refusals() as why:
        assert transform.forward_sites(KernelState(source=source, plan=plan_of(ARGS))) == []
    return " ".join(why)


LOOP = "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)"
REFUSED = {
    "a break": f"""__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} {{ if (x[i] < 0.0f) break; out[i] = x[i]; }}
}}""",
    "a barrier": f"""__global__ void kernel(const float* x, float* out, int n) {{
    __shared__ float t[256];
    {LOOP} {{ t[threadIdx.x] = x[i]; __syncthreads(); out[i] = t[255 - threadIdx.x]; }}
}}""",
    "an index moved in the work": f"""__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} {{ out[i] = x[i]; i++; }}
}}""",
    "a bound the kernel moves": f"""__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} {{ out[i] = x[i]; n--; }}
}}""",
    "a break hidden in a macro": f"""#define STOP break
__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} {{ if (x[i] < 0.0f) STOP; out[i] = x[i]; }}
}}""",
    "a block's stride": """__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x) out[i] = x[i];
}""",
    "a loop over blocks": """__global__ void kernel(const float* x, float* out, int n) {
    for (int r = blockIdx.x; r < n; r += gridDim.x) out[r] = x[r];
}""",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_loop_it_cannot_unroll_element_for_element_is_no_site(transform, case):
    assert "no loop that strides over the grid a thread at a time" in _refusal(transform, REFUSED[case])


def test_backward_refuses_an_unrolled_loop_whose_break_would_leave_the_whole_loop_rerolled(transform):
    """In the unrolled form a `break` leaves the inner loop, the rest of the step's elements; rerolled it would end
    the thread's loop: not the same kernel, so no simplification."""
    after = load(HERE / "reroll_grid_stride" / "axpy", "after", "kernel")
    unrolled = transform.forward(after, transform.forward_sites(after)[0]).state
    work = "y[i] = a * x[i] + y[i];"
    broken = KernelState(source=unrolled.source.replace(work, f"if (x[i] < 0.0f) break;\n                {work}"),
                         plan=unrolled.plan)
    (site,) = transform.find(broken)
    with pytest.raises(NotApplicable, match="would not unroll back"):
        transform.backward(broken, site)


def test_names_it_would_declare_and_nested_loops_are_refused_with_the_reason(transform):
    clash = f"""__global__ void kernel(const float* x, float* out, int n) {{
    const int i_base = 3;
    {LOOP} out[i] = x[i] + i_base;
}}"""
    assert "already names 'i_base'" in _refusal(transform, clash)
    nested = f"""__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} {{
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += blockDim.x * gridDim.x) out[j] += x[i];
    }}
}}"""
    assert "inside another grid-stride loop" in _refusal(transform, nested)


def test_a_macro_of_an_expression_is_read_through_and_one_that_assigns_is_refused(transform):
    kept = f"""#define CLAMP(v, lo, hi) ((v) < (lo) ? (lo) : (v) > (hi) ? (hi) : (v))
__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} out[i] = CLAMP(x[i], 0.0f, 1.0f);
}}"""
    assert [s.key for s in transform.forward_sites(KernelState(source=kept, plan=plan_of(ARGS)))] == ["loops*2"]
    bumps = f"""#define NEXT(j) (j += 7)
__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} {{ out[i] = x[i]; NEXT(i); }}
}}"""
    assert "uses the macro NEXT" in " ".join(_refusals_of(transform, bumps))


def _refusals_of(transform, source: str) -> list[str]:
    with refusals() as why:
        assert transform.forward_sites(KernelState(source=source, plan=plan_of(ARGS))) == []
    return why


def test_a_continue_moves_to_the_next_element_either_way_and_is_unrolled(transform):
    source = f"""__global__ void kernel(const float* x, float* out, int n) {{
    {LOOP} {{
        if (x[i] < 0.0f) continue;
        out[i] = x[i];
    }}
}}"""
    state = KernelState(source=source, plan=plan_of(ARGS))
    (site,) = transform.forward_sites(state)
    assert "if (x[i] < 0.0f) continue;" in transform.forward(state, site).state.source


SCALE = """__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = 2.0f * x[i] + 1.0f;
}
"""


def test_the_unrolled_loop_computes_the_same_bits_on_the_cpu_emulator(transform, tmp_path):
    """A grid of an eighth of the elements' blocks, so that each thread loops about eight times, over sizes with
    every kind of tail, on aligned and misaligned pointers."""
    import torch

    from tests.transforms import emulate

    plain = KernelState(source=SCALE, plan=plan_of('"x", "y", { scalar = "n", type = "i32" }', grid="cdiv(n, 1024)",
                                                   block=128))
    (site,) = transform.forward_sites(plain)
    unrolled = transform.forward(plain, site).state

    def inputs_of(n: int):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        return {"n": n}, {"x": x}, {"y": (torch.float32, n)}

    assert emulate.differences(tmp_path, plain, {"unrolled": unrolled}, ((1,), (129,), (1000,), (4099,)),
                               inputs_of) == []
