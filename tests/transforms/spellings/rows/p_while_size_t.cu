__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    const size_t stride = (size_t)blockDim.x * gridDim.x;
    size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    while (row < rows) {
        const float* in = x + row * cols;
        float ss = 0.0f;
        for (int j = 0; j < cols; ++j) ss += in[j] * in[j];
        const float s = rsqrtf(ss / cols + 1e-6f);
        for (int j = 0; j < cols; ++j) y[row * cols + j] = in[j] * s * w[j];
        row += stride;
    }
}
