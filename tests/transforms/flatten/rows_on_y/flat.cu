// y = relu(x + b), b broadcast down the rows: a block row of threads per matrix row, the row from blockIdx.y.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ b, float* __restrict__ y,
                       int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        int row = i / cols;
        int col = i % cols;
        float v = x[i] + b[col];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
