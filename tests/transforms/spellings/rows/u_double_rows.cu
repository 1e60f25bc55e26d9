__global__ void rms_norm(const double* __restrict__ x, const double* __restrict__ w, double* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    double acc = 0.0;
    for (int j = 0; j < cols; ++j) acc += x[row * cols + j] * x[row * cols + j];
    double s = rsqrt(acc / cols + 1e-6);
    for (int j = 0; j < cols; ++j) y[row * cols + j] = x[row * cols + j] * s * w[j];
}
