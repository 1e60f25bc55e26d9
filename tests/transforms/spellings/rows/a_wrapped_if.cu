__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    const int row = threadIdx.x + blockIdx.x * blockDim.x;
    if (row < rows) {
        float sum = 0.0f;
        for (int j = 0; j < cols; j++) {
            float v = x[row * cols + j];
            sum += v * v;
        }
        float inv = 1.0f / sqrtf(sum / (float)cols + 1e-6f);
        for (int j = 0; j < cols; j++) {
            y[row * cols + j] = x[row * cols + j] * inv * w[j];
        }
    }
}
