"""fix_grid_cap: a grid-stride kernel's grid sized to the GPU (`num_sms * K` blocks) becomes a fixed number of
blocks; forward finds its sites by analysis, on kernels that compute the same on any grid, and refuses with the
reason every kernel whose result the grid could change (each attack below is one such kernel)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from klineage.kernel import KernelState, load_kernel
from klineage.transforms import Anchor, NotApplicable, get, refusals
from tests.gpu_tools import forwarded
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

MSE = Path(__file__).resolve().parents[2] / "bench" / "transfer" / "mse_loss"
ARGS = '"x", "out", { scalar = "n", type = "i32" }'
CAPPED = "min(cdiv(n, 256), 256)"


@pytest.fixture(scope="module")
def transform():
    return get("fix_grid_cap")


@pytest.mark.parametrize("case", ["sum_squares", "row_scale"])
def test_golden(case):
    check_golden("fix_grid_cap", case)


@pytest.mark.parametrize("case", ["sum_squares", "row_scale"])
def test_golden_kernel_compiles(cache, case):
    """One source serves both plans: only the grid changes."""
    assert not (HERE / "fix_grid_cap" / case / "after.cu").exists()
    compiles_without_spills(load(HERE / "fix_grid_cap" / case, "before", "kernel"), cache)


def test_the_backward_keeps_the_sized_term_and_the_fixed_cap_in_its_carrier(transform):
    before = load(HERE / "fix_grid_cap" / "sum_squares", "before", "kernel")
    (site,) = transform.find(before)
    assert site == Anchor("kernel", "plan", "BLOCKS_PER_SM@256")
    assert transform.backward(before, site).carrier == {"blocks_per_sm": 8, "cap": 256}


def _grid(state: KernelState, entry: str = "kernel") -> str:
    return next(str(launch.grid[0]) for launch in state.plan.launches if launch.entry == entry)


def test_forward_sizes_the_held_out_mse_loss_grid_after_the_searchs_steps(transform):
    """mse_loss (bench/transfer, never walked) caps its grid at 256 blocks; the site stays through the two forwards
    the search takes there, and the forward puts a full SM of 256-thread blocks on every SM."""
    state = forwarded(forwarded(load_kernel(MSE / "naive"), "unaggregate_atomics"), "scalarize_grid_stride")
    (site,) = transform.forward_sites(state)
    assert site.key == "8@256"
    rewrite = transform.forward(state, site)
    assert _grid(rewrite.state, "mse_loss") == "min(cdiv(n, 256), num_sms * 8)"
    assert rewrite.state.source == state.source and _grid(rewrite.state, "zero_loss") == "1"


def test_loops_unrolled_by_reroll_grid_stride_are_read_as_the_plain_loops(transform):
    """After the warp's atomic, mse_loss's scalar loop unrolled two grids a step is still a site (its elements are the
    plain loop's, in the same order); with a `break` in the unrolled work it is not."""
    aggregated = forwarded(load_kernel(MSE / "naive"), "unaggregate_atomics")
    unrolled = forwarded(aggregated, "reroll_grid_stride")
    (site,) = transform.forward_sites(unrolled)
    assert site.key == "8@256"
    assert _grid(transform.forward(unrolled, site).state, "mse_loss") == "min(cdiv(n, 256), num_sms * 8)"
    work = "float d = a[i] - b[i];"
    broken = replace(unrolled, source=unrolled.source.replace(work, f"if (a[i] != a[i]) break;\n{work}"))
    with refusals() as why:
        assert transform.forward_sites(broken) == []
    assert "can leave its work early" in " ".join(why)


SUM = """__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += x[i];
    atomicAdd(out, s);
}
"""


@pytest.mark.parametrize(("block", "carrier", "keys"), [
    (256, None, ["8@256"]), (1024, None, ["2@256"]), (32, None, ["32@256"]),
    (256, {"blocks_per_sm": [4, 16, 4]}, ["4@256", "16@256"]),
])
def test_blocks_per_sm_come_from_the_card_else_from_a_full_sm_of_threads(transform, block, carrier, keys):
    state = KernelState(source=SUM, plan=plan_of(ARGS, grid=CAPPED, block=block))
    assert [site.key for site in transform.forward_sites(state, carrier)] == keys


def test_a_plain_fixed_grid_is_a_site_and_a_sized_grid_is_not(transform):
    plain = KernelState(source=SUM, plan=plan_of(ARGS, grid="120"))
    (site,) = transform.forward_sites(plain)
    assert _grid(transform.forward(plain, site).state) == "num_sms * 8"
    for grid in ("min(cdiv(n, 256), num_sms * 8)", "cdiv(n, 256)"):
        assert transform.forward_sites(KernelState(source=SUM, plan=plan_of(ARGS, grid=grid))) == []


def _refusal(transform, source: str, grid: str = CAPPED) -> str:
    with refusals() as why:
        assert transform.forward_sites(KernelState(source=source, plan=plan_of(ARGS, grid=grid))) == []
    return " ".join(why)


# each kernel's result depends on its grid, or the reading cannot show that it does not
ATTACKS = {
    "a partial a block": ("""__global__ void kernel(const float* x, float* out, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += x[i];
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}""", "reads `blockIdx.x` (line 4) outside"),
    "the last block": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) atomicAdd(out, x[i]);
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) atomicAdd(out, 1.0f);
}""", "outside the start or step"),
    "a store every thread makes": ("""__global__ void kernel(const float* x, float* out, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += x[i];
    out[0] = s;
}""", "stores to `out[0]` outside its grid-stride loops"),
    "a store through a dereference": ("""__global__ void kernel(const float* x, float* out, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += x[i];
    *out += s;
}""", "stores to `*out`"),
    "a count of blocks": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) atomicAdd(out, x[i]);
    if (threadIdx.x == 0) atomicAdd(out, 1.0f);
}""", "counts threads or blocks"),
    "an exchange": ("""__global__ void kernel(const float* x, float* out, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += x[i];
    atomicExch(out, s);
}""", "stores with `atomicExch`"),
    "a barrier in a thread's loop": ("""__global__ void kernel(const float* x, float* out, int n) {
    __shared__ float t[256];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        t[threadIdx.x] = x[i];
        __syncthreads();
        out[i] = t[255 - threadIdx.x];
    }
}""", "holds a barrier"),
    "a break": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        if (x[i] < 0.0f) break;
        out[i] = x[i];
    }
}""", "can leave its work early"),
    "a block's stride": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x) out[i] = x[i];
}""", "does not step by the grid's extent"),
    "two grids a step": ("""__global__ void kernel(const float* x, float* out, int n) {
    const int stride = blockDim.x * gridDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 2 * stride) out[i] = x[i];
}""", "does not step by the grid's extent"),
    "a shift before the index": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = 1 << 2 + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[i] = x[i];
}""", "not at a thread's or a block's place"),
    "an index moved in the work": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) { out[i] = x[i]; i++; }
}""", "assigns its index in its work"),
    "a bound of the grid": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < gridDim.x * 64; i += blockDim.x * gridDim.x) out[i] = x[i];
}""", "not bounded by `i < n`"),
    "a bound the kernel moves": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) { out[i] = x[i]; n--; }
}""", "bounded by 'n', which the kernel assigns"),
    "a second axis": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[i] = x[i] * blockIdx.y;
}""", "reads `blockIdx.y`"),
    "the block's place read in PTX": ("""__global__ void kernel(const float* x, float* out, int n) {
    unsigned b;
    asm("mov.u32 %0, %%ctaid.x;" : "=r"(b));
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[i] = x[i] * b;
}""", "reads `%ctaid`"),
    "the block's place hidden in a macro": ("""#define BLOCK blockIdx.x
__global__ void kernel(const float* x, float* out, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += x[i];
    if (threadIdx.x == 0) atomicAdd(out + BLOCK, s);
}""", "uses the macro BLOCK"),
    "the block's place taken whole": ("""__global__ void kernel(const float* x, float* out, int n) {
    const uint3 place = blockIdx;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[i] = x[i] * place.x;
}""", "takes `blockIdx` whole"),
    "a helper that reads the grid": ("""__device__ int place() { return blockIdx.x * blockDim.x + threadIdx.x; }
__global__ void kernel(const float* x, float* out, int n) {
    for (int i = place(); i < n; i += blockDim.x * gridDim.x) out[i] = x[i];
}""", "the device function place reads the grid"),
    "no grid-stride loop": ("""__global__ void kernel(const float* x, float* out, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(out, x[i]);
}""", "has no grid-stride loop"),
    "a reference": ("""__global__ void kernel(const float* x, float* out, int n) {
    float& first = out[0];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[i] = x[i];
    first = 1.0f;
}""", "declares a reference"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_kernel_the_grid_could_change_is_no_site_and_the_refusal_says_why(transform, attack):
    source, reason = ATTACKS[attack]
    assert reason in _refusal(transform, source)


def test_a_two_dimensional_launch_and_unlike_launches_are_no_sites(transform):
    state = KernelState(source=SUM, plan=plan_of(ARGS, grid=CAPPED))
    flat = state.plan.launches[0]
    square = replace(flat, grid=(CAPPED, 2, 1))
    other_cap = replace(flat, grid=("min(cdiv(n, 256), 512)", 1, 1))
    for launches in ((square,), (flat, other_cap)):
        other = replace(state, plan=replace(state.plan, launches=launches))
        with pytest.raises(NotApplicable):
            transform.forward(other, Anchor("kernel", "plan", "8@256"))
        assert transform.forward_sites(other) == []
