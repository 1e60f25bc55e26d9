// Naive L2 normalize: one thread per row, two passes.
__global__ void l2_normalize(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float squares = 0.0f;
    for (int j = 0; j < cols; ++j) squares += in[j] * in[j];
    float scale = 1.0f / fmaxf(sqrtf(squares), 1e-12f);
    for (int j = 0; j < cols; ++j) y[(long long)row * cols + j] = in[j] * scale;
}
