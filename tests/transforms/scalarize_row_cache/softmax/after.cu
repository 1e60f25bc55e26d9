// Row softmax, one thread per row: three passes over the row (max, sum of exponentials, store).
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float m = -INFINITY;
    float row_cache[64];
    if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                row_cache[cache_t] = in[j];
                {
                    m = fmaxf(m, row_cache[cache_t]);
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            m = fmaxf(m, in[j]);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float s = 0.0f;
    if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                {
                    s += expf(row_cache[cache_t] - m);
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            s += expf(in[j] - m);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                {
                    y[(long long)row * n + j] = expf(row_cache[cache_t] - m) / s;
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            y[(long long)row * n + j] = expf(in[j] - m) / s;
        }
    }
}
