// Naive row cumsum: one thread per row, a sequential running sum.
__global__ void cumsum(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float running = 0.0f;
    for (int j = 0; j < cols; ++j) {
        running += x[(long long)row * cols + j];
        y[(long long)row * cols + j] = running;
    }
}
