"""Why a forward's site search read no site (`klineage.transforms.refusals`): collected only while a caller
asks, one line per kernel and reason, helper functions left out, so that `library fit` can tell a user whether
a forward does not read their kernel's spelling or their kernel is no site for it."""

from __future__ import annotations

from klineage.kernel import KernelState
from klineage.transforms import get, refusals
from tests.transforms.golden import plan_of

SOURCE = """__device__ float twice(float v) { printf("%f", v); return 2.0f * v; }

__global__ void kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(x[i]);
}
"""
ARGS = '"x", "y", { scalar = "n", type = "i32" }'
FLAT = KernelState(source=SOURCE, plan=plan_of(ARGS))
GRID_2D = KernelState(source=SOURCE, plan=plan_of(ARGS, grid='cdiv(n, 256)", "4'))


def test_a_kernel_no_forward_reads_says_why_and_a_helper_is_not_named():
    stride = get("uncoarsen_grid_stride")
    assert stride.forward_sites(FLAT)  # one thread per element on a 1-D launch: its site
    with refusals() as refused:
        assert stride.forward_sites(GRID_2D) == []
        get("serialize_reduction").forward_sites(FLAT)
    assert refused and all(line.startswith("kernel: ") for line in refused)  # `twice` is no site by design
    assert any("more than 1 dimension" in line for line in refused)  # the 2-D launch is why, in words
    assert "kernel: kernel calls twice, which may have effects" in refused  # a helper with an effect (printf)


def test_refusals_are_collected_only_while_asked_and_each_once():
    stride = get("uncoarsen_grid_stride")
    with refusals() as first:
        stride.forward_sites(GRID_2D)
        stride.forward_sites(GRID_2D)  # the same kernel and reason twice: one line
    assert len(first) == 1
    stride.forward_sites(GRID_2D)  # nobody asks: nothing is kept, nothing leaks into the list already returned
    with refusals() as second:
        pass
    assert len(first) == 1 and second == []
