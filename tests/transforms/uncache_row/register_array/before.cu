// A block per row of at most THREADS * PER_THREAD columns: the row's mean, its centred sum of squares, then
// the normalized row. Each thread keeps the columns it owns in registers across the three passes.
constexpr int THREADS = 128;
constexpr int PER_THREAD = 8;

__device__ __forceinline__ float block_total(float v, float* red)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) total += red[w];
    __syncthreads();
    return total;
}

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    __shared__ float red[THREADS / 32];
    const float* __restrict__ row = x + (long long)blockIdx.x * n;
    float* __restrict__ out = y + (long long)blockIdx.x * n;
    const int tid = threadIdx.x;
    float held[PER_THREAD];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int c = k * THREADS + tid;
        if (c < n) {
            held[k] = row[c];
            sum += held[k];
        }
    }
    const float mean = block_total(sum, red) / n;
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int c = k * THREADS + tid;
        if (c < n) squares += (held[k] - mean) * (held[k] - mean);
    }
    const float rstd = rsqrtf(block_total(squares, red) / n + 1e-5f);
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int c = k * THREADS + tid;
        if (c < n) out[c] = (held[k] - mean) * rstd;
    }
}
