// ADVERSARIAL (race_no_barrier): each block loops over ROWS_PER_BLOCK rows and reuses one shared
// array for every block-wide reduction. The barrier after the last cross-warp read of a row is
// missing, so a warp that runs ahead writes the next row's partial maximum into red[] while a
// slower warp may still be folding this row's partial sums out of it. The gap between the two
// (a write pass over the row and the next row's loads) is long, so the answer is almost always
// right; compute-sanitizer racecheck reports the hazard every time.

constexpr int THREADS = 256;        // the most threads a block has; the plan may launch fewer
constexpr int MAX_WARPS = THREADS / 32;
constexpr int ROWS_PER_BLOCK = 4;
constexpr unsigned FULL_MASK = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

extern "C" __global__ void __launch_bounds__(THREADS)
row_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float red[MAX_WARPS];
    const int warps = blockDim.x >> 5;  // the plan sizes the block to the row: min(256, cols rounded up to 32)
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;

    const int first = blockIdx.x * ROWS_PER_BLOCK;
    const int last = min(first + ROWS_PER_BLOCK, rows);
    for (int row = first; row < last; ++row) {
        const float* xr = x + static_cast<size_t>(row) * cols;
        float* yr = y + static_cast<size_t>(row) * cols;

        float m = -INFINITY;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
        m = warp_max(m);
        if (lane == 0) red[warp] = m;
        __syncthreads();
        float row_max = red[0];
        for (int w = 1; w < warps; ++w) row_max = fmaxf(row_max, red[w]);
        __syncthreads();  // red[] is rewritten just below

        float s = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - row_max);
        s = warp_sum(s);
        if (lane == 0) red[warp] = s;
        __syncthreads();
        float total = red[0];
        for (int w = 1; w < warps; ++w) total += red[w];
        // BUG: no __syncthreads() here. The next row's `red[warp] = m` may land before a slow
        // warp has read red[w] above.

        const float inv_sum = 1.0f / total;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - row_max) * inv_sum;
    }
}
