// A 3-point average of each row, one block per row: the dynamic shared floats hold a scratch row
// (the block's running maxima) and, right after it, the row itself with a one-element halo.

constexpr int THREADS = 128;
constexpr int TILE = THREADS;                 // outputs per pass
constexpr int HALO = 1;

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ peak,
                                  int n)
{
    extern __shared__ float smem[];
    float* max_s = smem;                      // [THREADS] running maxima
    const float* xr = x + static_cast<long long>(blockIdx.x) * n;
    float* yr = y + static_cast<long long>(blockIdx.x) * n;
    float best = -INFINITY;
    for (int c0 = 0; c0 < n; c0 += TILE) {
        __syncthreads();
        const int c = c0 + threadIdx.x;
        if (c < n) {
            const float v = ((c0 + threadIdx.x - HALO >= 0 && c0 + threadIdx.x - HALO < n ? xr[c0 + threadIdx.x - HALO] : 0.0f) + (c0 + (threadIdx.x + 1) - HALO >= 0 && c0 + (threadIdx.x + 1) - HALO < n ? xr[c0 + (threadIdx.x + 1) - HALO] : 0.0f) + (c0 + (threadIdx.x + 2) - HALO >= 0 && c0 + (threadIdx.x + 2) - HALO < n ? xr[c0 + (threadIdx.x + 2) - HALO] : 0.0f)) / 3.0f;
            yr[c] = v;
            best = fmaxf(best, v);
        }
        __syncthreads();
    }
    max_s[threadIdx.x] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int t = 1; t < THREADS; ++t) best = fmaxf(best, max_s[t]);
        peak[blockIdx.x] = best;
    }
}
