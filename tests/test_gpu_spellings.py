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
  its int64 index (gather_dim1), the index packed four to a 32-byte vector by scalarize_elementwise; and the held-out
  scatter-add (bench/transfer/scatter_add) adding four elements of a row with one vector atomicAdd; the held-out
  batched product (bench/transfer/bmm_small) with each matrix's start read from `blockIdx.z` where it is used,
  tiled by untile_matmul; a product tiled in shared memory by hand (matmul_tiled, the CUDA tutorials' form, 32 x 32
  tiles), register-blocked by unblock_matmul; a linear layer with bias and GELU (linear_bias_gelu) whose row is a
  layer of the grid (`int row = blockIdx.y;` on a 1-D block) and whose sum starts from the bias, tiled by
  untile_matmul with the bias added after the loop; the held-out batched matvec (bench/transfer/batched_matvec)
  written a warp a row by hand, its butterfly shuffling down (`o >>= 1`, mask 0xffffffff) for lane 0 to store,
  vectorized by scalarize_row_walk; a linear layer's ReLU outputs summed over each row (linear_relu_row_sum), a
  thread a row looping over its outputs, each with its own dot over k, a warp and a block a row.

Each rewrite passes every case against its naive kernel under the gate's sanitizer, and its ratios against it and
torch eager are printed with whether the timing settled (run with -s).

    python -m pytest tests/test_gpu_spellings.py -v -s -n 0
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_tools import (
    forwarded,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage.kernel import KernelState, load_kernel
from klineage.launch import LaunchPlan

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
WARP_MATVEC = """// Batched matvec, a warp per output written by hand: the lanes stride the row, then a butterfly
// down whose sum lane 0 stores.
__global__ void batched_matvec(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y,
                               int outputs, int m, int k) {
    int lane = threadIdx.x & 31;
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= outputs) return;
    const float* xb = x + (long long)(row / m) * k;
    float acc = 0.0f;
    for (int j = lane; j < k; j += 32) acc += a[(long long)row * k + j] * xb[j];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffff, acc, o);
    if (lane == 0) y[row] = acc;
}
"""
INLINE_LAYER_BMM = """// Batched product, one thread per output, each matrix's start read from grid z where it is used.
__global__ void bmm(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int m, int n,
                    int k) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= m || col >= n) return;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += a[blockIdx.z * m * k + row * k + i] * b[blockIdx.z * k * n + i * n + col];
    c[blockIdx.z * m * n + row * n + col] = sum;
}
"""


BENCH = Path(__file__).resolve().parent.parent / "bench" / "transfer"
TRANSFER_CASES = {"headline", "ragged", "narrow", "small"}


@dataclass(frozen=True)
class Spelling:
    """A naive kernel as people spell it (the problem's own naive kernel where `source` is empty), the forward that
    reads it, what its rewrite must show, and what the gate compares it with."""

    name: str
    problem: Path  # the problem's folder: problem.py and naive/
    transform: str
    shows: tuple[str, ...]  # texts the rewrite holds
    source: str = ""
    cases: frozenset[str] = frozenset(CASES)
    vendor: str = "torch"
    launch: tuple[str, str] = ()  # (old, new) in the naive kernel's launch.toml, for a source launched otherwise

    def naive(self) -> KernelState:
        kernel = load_kernel(self.problem / "naive")
        if self.launch:
            toml = (self.problem / "naive" / "launch.toml").read_text()
            assert self.launch[0] in toml, self.launch
            kernel = KernelState(source=kernel.source, plan=LaunchPlan.from_toml(toml.replace(*self.launch)))
        return KernelState(source=self.source, plan=kernel.plan) if self.source else kernel

    def rewritten(self) -> KernelState:
        """The forward's rewrite at its first site, checked to show what it must."""
        written = forwarded(self.naive(), self.transform)
        missing = [text for text in self.shows if text not in written.source]
        assert not missing, (self.name, missing)
        return written


WARP, BLOCK = "serialize_reduction", "serialize_block_reduction"
SPELLINGS = [
    *(Spelling(f"masked_gemv-{t}", PROBLEMS / "masked_gemv", t,
               ("const float acc_start = bias[row];", "acc = acc_start + acc;")) for t in (WARP, BLOCK)),
    Spelling("matmul_at", PROBLEMS / "matmul_at", "untile_matmul",
             ("__shared__ float tile_a[16][17];", "C[r * N + c] = acc;"), MATMUL_AT, vendor="torch.matmul(A.T, B)"),
    Spelling("row_cummax", PROBLEMS / "row_cummax", WARP,
             ("m = fmaxf(m, __shfl_sync(0xffffffffu, scan_value, 31));",)),
    Spelling(f"row_argmin-{WARP}", PROBLEMS / "row_argmin", WARP, ("float best_value = row[best];",)),
    Spelling(f"row_argmin-{BLOCK}", PROBLEMS / "row_argmin", BLOCK, ("__shared__ float block_best_value[8];",)),
    Spelling("tensor_matmul", PROBLEMS / "tensor_matmul", "untile_matmul", ("A += n * M * K;", "if (m < M && l < L) {"),
             vendor="torch.matmul"),
    *(Spelling(f"batch_norm-{t}", PROBLEMS / "batch_norm", t, ("y[(n * C + c) * HW + i] = ",), vendor="F.batch_norm")
      for t in (WARP, BLOCK)),
    *(Spelling(f"log_softmax-{t}", BENCH / "log_softmax", t, ("const float pair_joined = fmaxf(m, pair_max);",),
               ONLINE_LOG_SOFTMAX, frozenset(TRANSFER_CASES)) for t in (WARP, BLOCK)),
    *(Spelling(f"layer_norm-{t}", BENCH / "layer_norm", t, ("const int pair_total = mean_count + pair_count;",),
               WELFORD_LAYER_NORM, frozenset(TRANSFER_CASES)) for t in (WARP, BLOCK)),
    Spelling("cumsum_peeled", BENCH / "cumsum", WARP, ("float running = -0.0f;", "__shfl_up_sync"), PEELED_CUMSUM,
             frozenset(TRANSFER_CASES)),
    Spelling("cumsum_read_back", BENCH / "cumsum", WARP, ("float running = -0.0f;", "__shfl_up_sync"),
             READ_BACK_CUMSUM, frozenset(TRANSFER_CASES)),
    Spelling("cummax_kept", PROBLEMS / "row_cummax", WARP,
             ("m = fmaxf(m, __shfl_sync(0xffffffffu, scan_value, 31));",), KEPT_CUMMAX),
    Spelling("gather_dim1", PROBLEMS / "gather_dim1", "scalarize_elementwise",
             ("const long4_16a idx4 = *reinterpret_cast<const long4_16a*>(idx + i);",), vendor="torch.gather"),
    Spelling("matmul_tiled_by_hand", PROBLEMS / "matmul_tiled", "unblock_matmul",
             ("block_acc[block_i][block_j] += block_ra[block_i] * block_rb[block_j];",), vendor="torch.matmul"),
    Spelling("bmm_inline_layer", BENCH / "bmm_small", "untile_matmul",
             ("unsigned int batch = blockIdx.z;", "a += batch * m * k;", "__shared__ float tile_a[16][16];"),
             INLINE_LAYER_BMM, vendor="torch.bmm"),
    Spelling("linear_bias_gelu", PROBLEMS / "linear_bias_gelu", "untile_matmul",
             ("if (row < M && col < N) {", "acc += b[col];"), vendor="F.linear + F.gelu"),
    Spelling("matvec_warp_by_hand", BENCH / "batched_matvec", "scalarize_row_walk",
             ("float4", "acc += __shfl_xor_sync(0xffffffffu, acc, offset);"), WARP_MATVEC,
             launch=("cdiv(batch * m, 128)", "cdiv(batch * m * 32, 128)")),
    *(Spelling(f"linear_relu_row_sum-{t}", PROBLEMS / "linear_relu_row_sum", t,
               ("for (int k = 0; k < K; ++k) acc += x[r * K + k] * W[n * K + k];",), vendor="F.linear + relu + sum")
      for t in (WARP, BLOCK)),
    Spelling("scatter_add_vector_atomic", BENCH / "scatter_add", "scalarize_row_gather",
             ("atomicAdd(reinterpret_cast<float4*>(out + ((long long)idx[r] * cols + c)), out4);",),
             cases=frozenset({"headline", "ragged", "small"}), vendor="index_add_"),
]


@pytest.mark.parametrize("spelling", SPELLINGS, ids=lambda spelling: spelling.name)
def test_the_rewrite_of_a_spelling_passes_every_case_against_its_naive_kernel(cache, spelling):
    passes_against(spelling.problem / "problem.py", spelling.rewritten(), spelling.naive(), set(spelling.cases), cache,
                   f"{spelling.name} ({spelling.transform})", "its naive kernel", vendor=spelling.vendor)
