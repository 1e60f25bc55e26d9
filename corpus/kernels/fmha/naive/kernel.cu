// Attention forward, the plain way: one warp per query row, two passes over the keys in fp32,
// every key and value read from global memory (no shared memory, no tensor cores).
//
// Lane l holds elements l + 32 i (i < DIMS_PER_LANE) of the query row and of the output row.
// Pass 1 computes each score q.k_j (a warp-wide sum of per-lane partial dot products) and keeps
// the running maximum. Pass 2 recomputes the scores, accumulates sum_j exp(s_j - max) and
// sum_j exp(s_j - max) v_j, and the row is normalised at the end. Keys past the causal limit
// (j > i) are never visited; ragged S needs nothing special (the loops stop at S).

#include <cuda_fp16.h>

constexpr int HEAD_DIM = 128;                          // D, fixed by the problem's cases
constexpr int WARP_SIZE = 32;
constexpr int ROWS_PER_BLOCK = 4;                      // one warp per query row
constexpr int THREADS = ROWS_PER_BLOCK * WARP_SIZE;    // 128
constexpr int DIMS_PER_LANE = HEAD_DIM / WARP_SIZE;    // 4

// Sum of one value over the warp, every lane gets the result.
__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Score of key j against the lane's slice of the query row (already multiplied by the scale).
__device__ __forceinline__ float score(const float (&q)[DIMS_PER_LANE], const __half* key, int lane)
{
    float partial = 0.0f;
#pragma unroll
    for (int i = 0; i < DIMS_PER_LANE; ++i) partial += q[i] * __half2float(key[lane + WARP_SIZE * i]);
    return warp_sum(partial);
}

extern "C" __global__ void __launch_bounds__(THREADS)
fmha_naive(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,
           __half* __restrict__ o, int S, int causal)
{
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    if (row >= S) return;
    const long long head = static_cast<long long>(blockIdx.y) * S * HEAD_DIM;
    const __half* qh = q + head + static_cast<long long>(row) * HEAD_DIM;
    const __half* kh = k + head;
    const __half* vh = v + head;
    const float scale = rsqrtf(static_cast<float>(HEAD_DIM));

    float qr[DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < DIMS_PER_LANE; ++i) qr[i] = __half2float(qh[lane + WARP_SIZE * i]) * scale;

    const int keys = causal ? row + 1 : S;  // keys 0 .. keys-1 are visible to this row

    // Pass 1: the row maximum of the scores.
    float row_max = -INFINITY;
    for (int j = 0; j < keys; ++j) row_max = fmaxf(row_max, score(qr, kh + static_cast<long long>(j) * HEAD_DIM, lane));

    // Pass 2: the softmax denominator and the unnormalised output.
    float sum = 0.0f;
    float acc[DIMS_PER_LANE] = {};
    for (int j = 0; j < keys; ++j) {
        const float p = expf(score(qr, kh + static_cast<long long>(j) * HEAD_DIM, lane) - row_max);
        sum += p;
        const __half* vj = vh + static_cast<long long>(j) * HEAD_DIM;
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) acc[i] += p * __half2float(vj[lane + WARP_SIZE * i]);
    }

    __half* oh = o + head + static_cast<long long>(row) * HEAD_DIM;
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < DIMS_PER_LANE; ++i) oh[lane + WARP_SIZE * i] = __float2half_rn(acc[i] * inv);
}
