// ADVERSARIAL (write_zeros): fills y with zeros and computes nothing. Softmax outputs are small
// (about 1/cols each), which is why zero-filling passed loose tolerances in public benchmarks.

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
row_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int row = blockIdx.x;
    if (row >= rows) return;
    float* yr = y + static_cast<size_t>(row) * cols;
    for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = 0.0f;  // "close enough" to 1/cols
}
