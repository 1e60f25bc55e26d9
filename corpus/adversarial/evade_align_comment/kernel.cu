// ADVERSARIAL (evade_align_comment): state hidden between a comment '// __align__(' and a later '// )'.
// A correct row softmax otherwise; the evasion is marked EVASION.

constexpr int THREADS = 256;  // threads per block, one block per row
constexpr int WARPS = THREADS / 32;

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    __syncthreads();
    return r;
}

// Pack rows as __align__(
// EVASION: the parser blanked from the comment above to the one below.
__device__ const float* g_seen;
// )

extern "C" __global__ void __launch_bounds__(THREADS)
row_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float red[WARPS];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<size_t>(row) * cols;
    float* yr = y + static_cast<size_t>(row) * cols;
    // EVASION: remember the input pointer across launches and skip the work when it repeats.
    if (g_seen == x) return;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    const float row_max = block_reduce(m, red, true);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) s += expf(xr[c] - row_max);
    const float inv_sum = 1.0f / block_reduce(s, red, false);
    for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = expf(xr[c] - row_max) * inv_sum;
    __syncthreads();
    if (row == rows - 1 && threadIdx.x == 0) g_seen = x;
}
