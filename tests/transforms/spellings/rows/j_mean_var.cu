__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float sum = 0.0f, sq = 0.0f;
    for (int j = 0; j < cols; ++j) { float v = x[row * cols + j]; sum += v; sq += v * v; }
    float mean = sum / cols;
    float var = sq / cols - mean * mean;
    float rstd = rsqrtf(var + 1e-5f);
    for (int j = 0; j < cols; ++j) y[row * cols + j] = (x[row * cols + j] - mean) * rstd * w[j];
}
