__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    double acc = 0.0;
    for (int j = 0; j < cols; ++j) acc += (double)x[row * cols + j] * x[row * cols + j];
    float s = (float)(1.0 / sqrt(acc / cols + 1e-6));
    for (int j = 0; j < cols; ++j) y[row * cols + j] = x[row * cols + j] * s * w[j];
}
