__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float peak = 0.0f;
    for (int j = 0; j < cols; ++j) peak = fmax(peak, fabs(x[row * cols + j]));
    float inv = peak > 0.0f ? 1.0f / peak : 0.0f;
    for (int j = 0; j < cols; ++j) y[row * cols + j] = x[row * cols + j] * inv * w[j];
}
