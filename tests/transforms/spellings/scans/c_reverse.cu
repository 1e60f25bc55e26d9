__global__ void scan(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float acc = 0.0f;
    for (int j = cols - 1; j >= 0; j--) {
        acc += x[row * cols + j];
        y[row * cols + j] = acc;
    }
}
