__global__ void scan(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float after = 1.0f;
    for (int j = cols - 1; j >= 0; --j) {
        y[row * cols + j] = after;
        after *= x[row * cols + j];
    }
}
