// Naive bias + ReLU: a block row of threads per matrix row (the row from blockIdx.y), one thread per element.
__global__ void bias_relu(const float* __restrict__ x, const float* __restrict__ b, float* __restrict__ y,
                          int rows, int cols) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (col < cols) {
        float v = x[row * cols + col] + b[col];
        y[row * cols + col] = v > 0.0f ? v : 0.0f;
    }
}
