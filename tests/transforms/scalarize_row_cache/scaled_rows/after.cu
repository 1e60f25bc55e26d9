// Scaled row norm, one thread per row: the row's mean absolute value, then each column scaled by a
// per-column gain and written into a padded output whose row pitch is its own argument.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ gain, float* __restrict__ y,
                       int rows, int n, int pitch) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float total = 0.0f;
    float row_cache[64];
    if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                row_cache[cache_t] = in[j];
                {
                    total += fabsf(row_cache[cache_t]);
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            total += fabsf(in[j]);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
    const float inv = n > 0 ? n / fmaxf(total, 1e-20f) : 0.0f;
    if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                {
                    y[(long long)row * pitch + j] = row_cache[cache_t] * inv * gain[j];
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            y[(long long)row * pitch + j] = in[j] * inv * gain[j];
        }
    }
}
