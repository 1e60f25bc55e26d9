// Transpose of a rows x cols matrix, one thread per element on a 1-D index split into a row and a column.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        int r = i / cols, c = i % cols;
        y[c * rows + r] = x[i];
    }
}
