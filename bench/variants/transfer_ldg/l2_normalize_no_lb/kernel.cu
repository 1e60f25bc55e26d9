// Naive L2 normalize: one thread per row, two passes.
__global__ void l2_normalize(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float squares = 0.0f;
    float row_cache[64];
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                row_cache[cache_t] = in[j];
                squares += row_cache[cache_t] * row_cache[cache_t];
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) squares += __ldg(&in[j]) * __ldg(&in[j]);
    }
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    float scale = 1.0f / fmaxf(sqrtf(squares), 1e-12f);
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                y[(long long)row * cols + j] = row_cache[cache_t] * scale;
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) y[(long long)row * cols + j] = __ldg(&in[j]) * scale;
    }
}
