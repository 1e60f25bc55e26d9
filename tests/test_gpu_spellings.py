"""Naive kernels spelled as people write them, read by the analysis forwards and gated on a real GPU (sm_90; skipped
elsewhere): the rewrites of the spellings pass every case against the kernel they came from.

- A masked matrix-vector product with a bias (tests/fixtures/gpu_problems/masked_gemv, written for this test),
  one thread per row in C's spelling: the sum starts from the bias, a pointer steps along the row, a bool mask keeps
  each product (`_sum_starts`, `_pointer_walks`, a conditional update). Shared by a warp a row
  (serialize_reduction) and by a block a row (serialize_block_reduction).
- C = A^T B (tests/fixtures/gpu_problems/matmul_at) spelled with the block's side as a macro, one guard per bound,
  each element named, subscript terms in another order, the output's offset named and a `#pragma unroll`: tiled by
  untile_matmul as the plain spelling is.
- Readings for operators outside the bench (fixtures written for this test): a running maximum (row_cummax, fmaxf
  scanned by shuffles, lanes past the row's end contributing NaN), an argmin that reads its best value back through
  its index (row_argmin, on rows full of ties), each a warp a row by serialize_reduction; and a 3-D tensor times a
  matrix whose guard bounds the batch too (tensor_matmul), tiled by untile_matmul; a batch norm in training mode
  (batch_norm) whose thread per channel walks nests over images and pixels and stores the normalized values in the
  last, a warp and a block a channel; a log-softmax whose normalizer is one pass (a running maximum and the sum
  rescaled to it), the held-out log_softmax problem (bench/transfer/log_softmax) with that spelling, a warp a row;
  the held-out layer_norm problem (bench/transfer/layer_norm) with its statistics in one pass by Welford's update
  counted by the loop index, a warp a row; the one-pass statistics and the argmin a block a row too (each warp's
  tuple joined through shared slots); a running sum whose first element is peeled before its loop, or whose running
  value is read back from the element stored before (the held-out cumsum problem, bench/transfer/cumsum, so
  spelled), and a running maximum kept by a compare (row_cummax), each a warp a row; torch.gather along rows with
  its int64 index (gather_dim1), the index packed four to a 32-byte vector by scalarize_elementwise.

Each rewrite passes every case against its naive kernel under the gate's sanitizer, and its ratios against it and
torch eager are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_spellings.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import (
    forwarded,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage.kernel import KernelState, load_kernel

pytestmark = pytest.mark.gpu
PROBLEMS = Path(__file__).resolve().parent / "fixtures" / "gpu_problems"
CASES = {"headline", "ragged", "small"}  # each problem's CASES (a problem file runs only in the sandbox)

ONLINE_LOG_SOFTMAX = """// Log-softmax, one thread per row, the normalizer in one pass over the row.
__global__ void log_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float m = -INFINITY, s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        float v = in[j];
        float m_new = fmaxf(m, v);
        s = s * expf(m - m_new) + expf(v - m_new);
        m = m_new;
    }
    float shift = m + logf(s);
    for (int j = 0; j < cols; ++j) y[(long long)row * cols + j] = in[j] - shift;
}
"""
WELFORD_LAYER_NORM = """// Layer norm, one thread per row, the mean and variance in one pass by Welford's update.
__global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                           float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float mean = 0.0f, m2 = 0.0f;
    for (int j = 0; j < cols; ++j) {
        float v = in[j];
        float d = v - mean;
        mean += d / (float)(j + 1);
        m2 += d * (v - mean);
    }
    float rstd = rsqrtf(m2 / cols + 1e-5f);
    for (int j = 0; j < cols; ++j) y[(long long)row * cols + j] = (in[j] - mean) * rstd * w[j] + b[j];
}
"""
PEELED_CUMSUM = """// Cumsum, one thread per row, the first element stored before the loop over the rest.
__global__ void cumsum(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float running = x[(long long)row * cols];
    y[(long long)row * cols] = running;
    for (int j = 1; j < cols; ++j) {
        running += x[(long long)row * cols + j];
        y[(long long)row * cols + j] = running;
    }
}
"""
READ_BACK_CUMSUM = """// Cumsum, one thread per row, each prefix the one stored before plus the element.
__global__ void cumsum(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float* out = y + (long long)row * cols;
    out[0] = in[0];
    for (int j = 1; j < cols; j++)
        out[j] = out[j - 1] + in[j];
}
"""
KEPT_CUMMAX = """// Cummax, one thread per row, the running maximum kept by a compare.
__global__ void cummax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) {
        float v = x[row * cols + j];
        if (v > m) m = v;
        y[row * cols + j] = m;
    }
}
"""
MATMUL_AT = """// C = A^T B, one thread per output, with the block's side a macro, a guard per bound, named elements.
#define TILE 16
__global__ void matmul_at(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                          int N, int K) {
    int r = blockIdx.y * TILE + threadIdx.y;
    int c = blockIdx.x * TILE + threadIdx.x;
    if (r < M) {
        if (c < N) {
            float acc = 0;
#pragma unroll 4
            for (int k = 0; k < K; k += 1) {
                const float a = A[r + k * M];
                const float b = B[c + N * k];
                acc = acc + a * b;
            }
            int out = r * N + c;
            C[out] = acc;
        }
    }
}
"""


@pytest.mark.parametrize("transform", ["serialize_reduction", "serialize_block_reduction"])
def test_the_rows_of_a_masked_product_from_a_bias_pass_every_case_against_the_naive_kernel(cache, transform):
    naive = load_kernel(PROBLEMS / "masked_gemv" / "naive")
    shared = forwarded(naive, transform)
    assert "const float acc_start = bias[row];" in shared.source and "acc = acc_start + acc;" in shared.source
    passes_against(PROBLEMS / "masked_gemv" / "problem.py", shared, naive, CASES, cache,
                   f"the masked product with a bias ({transform})", "the naive kernel")


def test_the_tiles_of_a_respelled_product_pass_every_case_against_it(cache):
    spelled = KernelState(source=MATMUL_AT, plan=load_kernel(PROBLEMS / "matmul_at" / "naive").plan)
    tiled = forwarded(spelled, "untile_matmul")
    assert "__shared__ float tile_a[16][17];" in tiled.source and "C[r * N + c] = acc;" in tiled.source
    passes_against(PROBLEMS / "matmul_at" / "problem.py", tiled, spelled, CASES, cache,
                   "the tiled A^T B of the respelled kernel", "the respelled kernel", vendor="torch.matmul(A.T, B)")


@pytest.mark.parametrize("problem, held, transform", [
    ("row_cummax", "m = fmaxf(m, __shfl_sync(0xffffffffu, scan_value, 31));", "serialize_reduction"),
    ("row_argmin", "float best_value = row[best];", "serialize_reduction"),
    ("row_argmin", "__shared__ float block_best_value[8];", "serialize_block_reduction")])
def test_a_running_maximum_and_an_argmin_read_back_pass_every_case(cache, problem, held, transform):
    naive = load_kernel(PROBLEMS / problem / "naive")
    shared = forwarded(naive, transform)
    assert held in shared.source
    passes_against(PROBLEMS / problem / "problem.py", shared, naive, CASES, cache, f"{problem} ({transform})",
                   "the naive kernel")


def test_the_tiles_of_a_tensor_times_a_matrix_bounded_by_its_batch_pass_every_case(cache):
    naive = load_kernel(PROBLEMS / "tensor_matmul" / "naive")
    tiled = forwarded(naive, "untile_matmul")
    assert "A += n * M * K;" in tiled.source and "if (m < M && l < L) {" in tiled.source
    passes_against(PROBLEMS / "tensor_matmul" / "problem.py", tiled, naive, CASES, cache,
                   "the tiled 3-D tensor-matrix product", "the naive kernel", vendor="torch.matmul")


@pytest.mark.parametrize("transform", ["serialize_reduction", "serialize_block_reduction"])
def test_a_batch_norm_storing_in_its_nest_passes_every_case_shared_by_a_channels_lanes(cache, transform):
    naive = load_kernel(PROBLEMS / "batch_norm" / "naive")
    shared = forwarded(naive, transform)
    assert "y[(n * C + c) * HW + i] = " in shared.source
    passes_against(PROBLEMS / "batch_norm" / "problem.py", shared, naive, CASES, cache,
                   f"the batch norm ({transform})", "the naive kernel", vendor="F.batch_norm")


@pytest.mark.parametrize("transform", ["serialize_reduction", "serialize_block_reduction"])
@pytest.mark.parametrize("operator, source, joined", [
    ("log_softmax", ONLINE_LOG_SOFTMAX, "const float pair_joined = fmaxf(m, pair_max);"),
    ("layer_norm", WELFORD_LAYER_NORM, "const int pair_total = mean_count + pair_count;")])
def test_a_one_pass_statistic_passes_every_case_of_its_held_out_problem(cache, operator, source, joined, transform):
    problem = Path(__file__).resolve().parent.parent / "bench" / "transfer" / operator
    naive = KernelState(source=source, plan=load_kernel(problem / "naive").plan)
    shared = forwarded(naive, transform)
    assert joined in shared.source
    passes_against(problem / "problem.py", shared, naive, {"headline", "ragged", "narrow", "small"}, cache,
                   f"the one-pass {operator} ({transform})", "the naive kernel")


BENCH = Path(__file__).resolve().parent.parent / "bench" / "transfer"


@pytest.mark.parametrize("problem, source, read", [
    (BENCH / "cumsum", PEELED_CUMSUM, "float running = -0.0f;"),
    (BENCH / "cumsum", READ_BACK_CUMSUM, "float running = -0.0f;"),
    (PROBLEMS / "row_cummax", KEPT_CUMMAX, "m = fmaxf(m, __shfl_sync(0xffffffffu, scan_value, 31));")])
def test_a_scan_peeled_read_back_or_kept_by_a_compare_passes_every_case(cache, problem, source, read):
    naive = KernelState(source=source, plan=load_kernel(problem / "naive").plan)
    shared = forwarded(naive, "serialize_reduction")
    assert read in shared.source and "__shfl_up_sync" in shared.source
    cases = {"headline", "ragged", "small"} | ({"narrow"} if problem.parent == BENCH else set())
    passes_against(problem / "problem.py", shared, naive, cases, cache, f"the respelled {problem.name} (a warp a row)",
                   "the naive kernel")


def test_a_gather_by_an_int64_index_packs_the_index_and_passes_every_case(cache):
    naive = load_kernel(PROBLEMS / "gather_dim1" / "naive")
    packed = forwarded(naive, "scalarize_elementwise")
    assert "const long4_16a idx4 = *reinterpret_cast<const long4_16a*>(idx + i);" in packed.source
    passes_against(PROBLEMS / "gather_dim1" / "problem.py", packed, naive, CASES, cache,
                   "the gather with its int64 index packed", "the naive kernel", vendor="torch.gather")
