__global__ void rms_norm(const float* x, const float* w, float* y, int rows, int cols) {
    size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= (size_t)rows) return;
    float acc = 0.f;
    for (int j = 0; j < cols; ++j) acc += x[row * cols + j] * x[row * cols + j];
    const float r = rsqrtf(acc / cols + 1e-6f);
    for (int j = 0; j < cols; ++j) y[row * cols + j] = w[j] * (x[row * cols + j] * r);
}
