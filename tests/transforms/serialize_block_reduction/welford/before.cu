// Row layer norm, one thread per row, the mean and variance in one pass by Welford's update, then the store.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = blockIdx.x;
    const int lane = threadIdx.x;
    if (row >= rows) return;
    float mean = 0.0f;
    float m2 = 0.0f;
    int count = 0;
    for (int j = lane; j < n; j += 256) {
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
    {
        __shared__ int block_count[8];
        __shared__ float block_mean[8];
        __shared__ float block_m2[8];
        if (lane % 32 == 0) {
            block_count[lane / 32] = count;
            block_mean[lane / 32] = mean;
            block_m2[lane / 32] = m2;
        }
        __syncthreads();
        count = block_count[0];
        mean = block_mean[0];
        m2 = block_m2[0];
        for (int block_warp = 1; block_warp < 8; ++block_warp) {
            const int pair_total = count + block_count[block_warp];
            const float pair_delta = block_mean[block_warp] - mean;
            if (pair_total > 0) {
                m2 = m2 + block_m2[block_warp] + pair_delta * pair_delta * ((float)count * (float)block_count[block_warp] / (float)pair_total);
                mean = ((float)count * mean + (float)block_count[block_warp] * block_mean[block_warp]) / (float)pair_total;
            }
            count = pair_total;
        }
        __syncthreads();
    }
    float rstd = 1.0f / sqrtf(m2 / n + 1e-5f);
    for (int j = lane; j < n; j += 256) y[row * n + j] = (x[row * n + j] - mean) * rstd;
}
