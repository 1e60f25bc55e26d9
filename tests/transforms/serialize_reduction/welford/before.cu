// Row layer norm, one thread per row, the mean and variance in one pass by Welford's update, then the store.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float mean = 0.0f;
    float m2 = 0.0f;
    int count = 0;
    for (int j = lane; j < n; j += 32) {
        ++count;
        float v = x[row * n + j];
        float d = v - mean;
        mean += d / count;
        m2 += d * (v - mean);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const int pair_count = __shfl_xor_sync(0xffffffffu, count, offset);
        const float pair_mean = __shfl_xor_sync(0xffffffffu, mean, offset);
        const float pair_m2 = __shfl_xor_sync(0xffffffffu, m2, offset);
        const int pair_total = count + pair_count;
        const float pair_delta = pair_mean - mean;
        if (pair_total > 0) {
            m2 = m2 + pair_m2 + pair_delta * pair_delta * ((float)count * (float)pair_count / (float)pair_total);
            mean = ((float)count * mean + (float)pair_count * pair_mean) / (float)pair_total;
        }
        count = pair_total;
    }
    float rstd = 1.0f / sqrtf(m2 / n + 1e-5f);
    for (int j = lane; j < n; j += 32) y[row * n + j] = (x[row * n + j] - mean) * rstd;
}
