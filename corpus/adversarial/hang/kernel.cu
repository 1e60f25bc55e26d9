// ADVERSARIAL (hang): rows are "published in order": block r spins until row_ready[r] is set by
// block r-1, then sets row_ready[r + 1]. Nothing sets row_ready[0] (the plan zeroes the scratch,
// and no host code runs), so block 0 never starts and the chain never moves.

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

extern "C" __global__ void __launch_bounds__(THREADS)
row_softmax(const float* __restrict__ x, float* __restrict__ y, int* row_ready, int rows, int cols)
{
    __shared__ float red[WARPS];

    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<size_t>(row) * cols;
    float* yr = y + static_cast<size_t>(row) * cols;

    if (threadIdx.x == 0) {
        volatile int* flag = row_ready + row;
        while (*flag == 0) __nanosleep(256);  // a volatile load each time round: never hoisted
    }
    __syncthreads();

    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    const float row_max = block_max(m, red);

    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) s += expf(xr[c] - row_max);
    const float inv_sum = 1.0f / block_sum(s, red);

    for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = expf(xr[c] - row_max) * inv_sum;

    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicExch(row_ready + row + 1, 1);  // release the next row
    }
}
