// y = relu(x + b), b broadcast down the rows: a block row of threads per matrix row, the row from blockIdx.y.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ b, float* __restrict__ y,
                       int rows, int cols) {
    int col = threadIdx.x + blockIdx.x * blockDim.x;
    int row = blockIdx.y;
    if (col < cols) {
        float v = x[row * cols + col] + b[col];
        y[row * cols + col] = v > 0.0f ? v : 0.0f;
    }
}
