"""A block-per-row kernel's sum added into shared memory by every thread's atomic, then made once a warp
(unaggregate_atomics' forward on a block's shared sum) on a real GPU (sm_90; skipped elsewhere).

The held-out RMS norm (bench/transfer/rms_norm, which no corpus walk or card has seen; judged here by its copy
tests/fixtures/gpu_problems/rms_norm_unordered, whose runs may differ in the last bits, as float atomics make them)
written the way a first block-per-row kernel often is: each thread sums the squares of a stride of the row, adds
its partial to one `__shared__` total with `atomicAdd`, and every thread reads the total past a barrier.
Forwarded, a butterfly of shuffles sums each warp's partials and one lane a warp adds them: 8 shared atomics a
block of 256 threads on the address, not 256. The warp form passes every case against the shared-atomic kernel
under the gate's sanitizer, and its ratios against that kernel and torch eager are printed with whether the timing
settled (run with -s).

    python -m pytest tests/test_gpu_block_atomics.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import forwarded, gate_cache, passes_against
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan

pytestmark = pytest.mark.gpu
RMS_NORM = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "rms_norm_unordered"
CASES = {"headline", "ragged", "narrow", "small"}  # the problem's CASES (a problem file runs only in the sandbox)

SHARED_ATOMIC = """// RMS norm, one block a row: every thread adds its partial sum of squares to a shared total.
__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                         int rows, int cols) {
    __shared__ float squares;
    if (threadIdx.x == 0) squares = 0.0f;
    __syncthreads();
    const float* in = x + (long long)blockIdx.x * cols;
    float part = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) part += in[j] * in[j];
    atomicAdd(&squares, part);
    __syncthreads();
    const float scale = rsqrtf(squares / cols + 1e-6f);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) y[(long long)blockIdx.x * cols + j] = in[j] * scale * w[j];
}
"""

PLAN = """name = "rms_norm_block_shared_atomic"
problem = "rms_norm_unordered"
source = "kernel.cu"
arch = "sm_90"
nvcc_flags = ["-O3"]

[[launch]]
entry = "rms_norm"
grid = ["rows"]
block = [256]
shared = 0
args = ["x", "w", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }]
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return gate_cache(tmp_path_factory)


def test_the_warps_shared_atomics_pass_every_case_against_every_threads(cache):
    atomics = KernelState(source=SHARED_ATOMIC, plan=LaunchPlan.from_toml(PLAN))
    aggregated = forwarded(atomics, "unaggregate_atomics")
    assert "if (threadIdx.x % 32 == 0) atomicAdd(&squares, warp_total);" in aggregated.source
    passes_against(RMS_NORM / "problem.py", aggregated, atomics, CASES, cache,
                   "rms_norm's block sum made once a warp", "every thread's shared atomic")
