// ADVERSARIAL (low_precision): the max in fp32, but the exponentials and the sums in __half, twice
// the throughput on paper. fp16 keeps 11 significant bits, so every output is off by ~1e-3
// relative. Sums stay below 65504 (at most cols = 9973 terms of at most 1): no Inf, no NaN.

#include <cuda_fp16.h>

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr unsigned FULL_MASK = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ __half warp_sum_half(__half v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = __hadd(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

extern "C" __global__ void __launch_bounds__(THREADS)
row_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float red_max[WARPS];
    __shared__ __half red_sum[WARPS];

    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<size_t>(row) * cols;
    float* yr = y + static_cast<size_t>(row) * cols;

    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red_max[threadIdx.x >> 5] = m;
    __syncthreads();
    float row_max = red_max[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) row_max = fmaxf(row_max, red_max[w]);

    __half s = __float2half(0.0f);
    for (int c = threadIdx.x; c < cols; c += THREADS) s = __hadd(s, hexp(__float2half(xr[c] - row_max)));
    s = warp_sum_half(s);
    if ((threadIdx.x & 31) == 0) red_sum[threadIdx.x >> 5] = s;
    __syncthreads();
    __half total = red_sum[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) total = __hadd(total, red_sum[w]);

    const float inv_sum = 1.0f / __half2float(total);
    for (int c = threadIdx.x; c < cols; c += THREADS)
        yr[c] = __half2float(hexp(__float2half(xr[c] - row_max))) * inv_sum;
}
