__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * 128 + threadIdx.x;
    if (row >= rows) return;
    float acc = float(0);
    for (int j = 0; j < cols; ++j) acc += x[row * cols + j] * x[row * cols + j];
    float s = rsqrt(acc / cols + 1e-6f);
    for (int j = 0; j < cols; ++j) y[row * cols + j] = x[row * cols + j] * s * w[j];
}
