// Naive layer norm: one thread per row reads its row three times (mean, variance, normalize).
__global__ void __launch_bounds__(128) layer_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                           float* __restrict__ y, int rows, int cols) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float sum = 0.0f;
    float row_cache[64];
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                row_cache[cache_t] = in[j];
                sum += row_cache[cache_t];
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) sum += __ldg(&in[j]);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    float mean = sum / cols;
    float squares = 0.0f;
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                {
                    float d = row_cache[cache_t] - mean;
                    squares += d * d;
                }
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) {
            float d = __ldg(&in[j]) - mean;
            squares += d * d;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    float rstd = rsqrtf(squares / cols + 1e-5f);
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                y[(long long)row * cols + j] = (row_cache[cache_t] - mean) * rstd * __ldg(&w[j]) + __ldg(&b[j]);
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) y[(long long)row * cols + j] = (__ldg(&in[j]) - mean) * rstd * __ldg(&w[j]) + __ldg(&b[j]);
    }
}
