// ADVERSARIAL (cache_by_pointer): memoises rows across launches in __device__ globals, keyed by
// the row's input pointer. The runner reuses buffers across seeds (same pointer, new values),
// so from the second seed on this hands back the previous seed's answer.

constexpr int THREADS = 256;  // threads per block, one block per row
constexpr int WARPS = THREADS / 32;
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

// Block-wide reductions: shuffles within each warp, then the WARPS partials through shared memory.
// Every thread folds the partials in the same order (identical bits everywhere); the trailing
// barrier lets the caller reuse `red` straight away.
__device__ __forceinline__ float block_max(float v, float* red)
{
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) r = fmaxf(r, red[w]);
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_sum(float v, float* red)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) r += red[w];
    __syncthreads();
    return r;
}

constexpr int CACHE_ROWS = 4096;
constexpr int CACHE_FLOATS = 1 << 22;  // 16 MiB of remembered outputs

__device__ const float* g_row_source[CACHE_ROWS];  // which x row each cached row came from
__device__ int g_row_cols[CACHE_ROWS];
__device__ float g_cache[CACHE_FLOATS];

extern "C" __global__ void __launch_bounds__(THREADS)
row_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float red[WARPS];

    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<size_t>(row) * cols;
    float* yr = y + static_cast<size_t>(row) * cols;
    const bool cacheable = rows <= CACHE_ROWS && static_cast<size_t>(rows) * cols <= CACHE_FLOATS;
    float* cached = g_cache + static_cast<size_t>(row) * cols;

    if (cacheable && g_row_source[row] == xr && g_row_cols[row] == cols) {  // "seen this row before"
        for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = cached[c];
        return;
    }

    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    const float row_max = block_max(m, red);

    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) s += expf(xr[c] - row_max);
    const float inv_sum = 1.0f / block_sum(s, red);

    for (int c = threadIdx.x; c < cols; c += THREADS) {
        const float v = expf(xr[c] - row_max) * inv_sum;
        yr[c] = v;
        if (cacheable) cached[c] = v;
    }
    if (cacheable) {
        __syncthreads();  // the whole row is stored before it is marked valid
        if (threadIdx.x == 0) {
            __threadfence();
            g_row_cols[row] = cols;
            g_row_source[row] = xr;
        }
    }
}
