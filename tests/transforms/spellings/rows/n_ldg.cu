__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float sum = 0.0f;
        for (int j = 0; j < cols; j++) {
            float v = __ldg(&x[row * cols + j]);
            sum += v * v;
        }
        float inv = 1.0f / sqrtf(sum / (float)cols + 1e-6f);
        for (int j = 0; j < cols; j++) {
            y[row * cols + j] = __ldg(&x[row * cols + j]) * inv * __ldg(&w[j]);
        }
    }
}
