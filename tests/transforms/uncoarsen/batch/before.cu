// Each block squashes its row into shared memory, then writes it back reversed. The row is read in
// batches: a thread issues LOAD_BATCH loads, THREADS apart, before it stores any of them.

constexpr int THREADS = 128;
constexpr int LOAD_BATCH = 4;  // loads a thread keeps in flight

__device__ __forceinline__ float squash(float v) { return v / (1.0f + fabsf(v)); }

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    extern __shared__ float row[];
    const float* xr = x + static_cast<long long>(blockIdx.x) * n;
    for (int i0 = threadIdx.x; i0 < n; i0 += THREADS * LOAD_BATCH) {
        float v[LOAD_BATCH];
        for (int b = 0; b < LOAD_BATCH; ++b) {
            const int i = i0 + b * THREADS;
            if (i < n) v[b] = xr[i];
        }
        for (int b = 0; b < LOAD_BATCH; ++b) {
            const int i = i0 + b * THREADS;
            if (i < n) row[i] = squash(v[b]);
        }
    }
    __syncthreads();
    float* yr = y + static_cast<long long>(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += THREADS) yr[i] = row[n - 1 - i];
}
