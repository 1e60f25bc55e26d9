__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    unsigned row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float ss = 0.0f;
    for (unsigned j = 0; j < cols; ++j) ss += x[row * cols + j] * x[row * cols + j];
    float mean = ss / cols;
    float s = 1.0f / sqrtf(mean + 1e-6f);
    for (unsigned j = 0; j < cols; ++j) y[row * cols + j] = x[row * cols + j] * s * w[j];
}
