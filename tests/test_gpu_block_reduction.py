"""A block-per-row kernel's shared-memory trees reduced through warp shuffles (unshuffle_block_reduction's forward)
on a real GPU (sm_90; skipped elsewhere).

The held-out log-softmax (bench/transfer/log_softmax, which no corpus walk or card has seen) written the way a
block-per-row kernel usually is: each thread takes a stride of the row, and two shared-memory trees, a max and then
a sum, combine the block's partials, with a barrier at every level. Forwarded, each tree becomes a shuffle
reduction within each warp, one shared slot a warp, and a pass of the first warp. The shuffle form passes every
case against the tree kernel under the gate's sanitizer, and its ratios against that kernel and torch eager are
printed with whether the timing settled (run with -s). The corpus's naive row softmax, the walk's plain end, is
written the same way and is gated the same way against itself.

    python -m pytest tests/test_gpu_block_reduction.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import (
    forwarded,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage import corpus
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan

pytestmark = pytest.mark.gpu
LOG_SOFTMAX = Path(__file__).resolve().parent.parent / "bench" / "transfer" / "log_softmax"
CASES = {"headline", "ragged", "narrow", "small"}  # the problem's CASES (a problem file runs only in the sandbox)

TREES = """// Log-softmax, one block a row: a block-wide max and a block-wide sum through shared-memory trees.
__global__ void log_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    __shared__ float red[256];
    const int t = threadIdx.x;
    const float* in = x + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int j = t; j < cols; j += blockDim.x) m = fmaxf(m, in[j]);
    red[t] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = fmaxf(red[t], red[t + s]);
        __syncthreads();
    }
    const float row_max = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int j = t; j < cols; j += blockDim.x) sum += expf(in[j] - row_max);
    red[t] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) red[t] += red[t + s];
        __syncthreads();
    }
    const float shift = row_max + logf(red[0]);
    for (int j = t; j < cols; j += blockDim.x) y[(long long)blockIdx.x * cols + j] = in[j] - shift;
}
"""

PLAN = """name = "log_softmax_block_trees"
problem = "log_softmax"
source = "kernel.cu"
arch = "sm_90"
nvcc_flags = ["-O3"]

[[launch]]
entry = "log_softmax"
grid = ["rows"]
block = [256]
shared = 0
args = ["x", "y", { scalar = "rows", type = "i32" }, { scalar = "cols", type = "i32" }]
"""



def test_the_shuffle_reductions_pass_every_case_against_the_shared_memory_trees(cache):
    trees = KernelState(source=TREES, plan=LaunchPlan.from_toml(PLAN))
    shuffled = forwarded(trees, "unshuffle_block_reduction")
    assert shuffled.source.count("__shfl_down_sync") == 4 and shuffled.plan == trees.plan
    passes_against(LOG_SOFTMAX / "problem.py", shuffled, trees, CASES, cache,
                   "log_softmax's block reductions through shuffles", "the shared-memory trees")


def test_the_corpus_naive_softmax_through_shuffles_passes_every_case_against_its_trees(cache):
    naive = corpus.kernel_entry("row_softmax/naive").load()
    shuffled = forwarded(naive, "unshuffle_block_reduction")
    assert shuffled.source.count("__shfl_down_sync") == 4
    passes_against(corpus.problem_path("row_softmax"), shuffled, naive,
                   {"headline", "ragged", "long_rows", "narrow", "mid_aligned", "small"}, cache,
                   "row_softmax's naive kernel through shuffles", "its shared-memory trees")
