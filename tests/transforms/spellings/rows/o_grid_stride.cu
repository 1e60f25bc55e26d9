__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += blockDim.x * gridDim.x) {
        float ss = 0.0f;
        for (int j = 0; j < cols; ++j) ss += x[row * cols + j] * x[row * cols + j];
        const float s = rsqrtf(ss / cols + 1e-6f);
        for (int j = 0; j < cols; ++j) y[row * cols + j] = x[row * cols + j] * s * w[j];
    }
}
