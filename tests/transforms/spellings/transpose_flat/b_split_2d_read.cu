__global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    const int idx = threadIdx.x + blockIdx.x * blockDim.x;
    if (idx < rows * cols) {
        const int col = idx % cols;
        const int row = idx / cols;
        y[col * rows + row] = x[row * cols + col];
    }
}
