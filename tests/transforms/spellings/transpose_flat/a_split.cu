__global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        int r = i / cols, c = i % cols;
        y[c * rows + r] = x[i];
    }
}
