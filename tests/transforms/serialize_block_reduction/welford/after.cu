// Row layer norm, one thread per row, the mean and variance in one pass by Welford's update, then the store.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float mean = 0.0f;
    float m2 = 0.0f;
    int count = 0;
    for (int j = 0; j < n; ++j) {
        ++count;
        float v = x[row * n + j];
        float d = v - mean;
        mean += d / count;
        m2 += d * (v - mean);
    }
    float rstd = 1.0f / sqrtf(m2 / n + 1e-5f);
    for (int j = 0; j < n; ++j) y[row * n + j] = (x[row * n + j] - mean) * rstd;
}
