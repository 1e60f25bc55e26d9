// y[0] = the mean of every element, computed by the grid's first thread alone (`if (i == 0)`); the others idle.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 1) {
        float s = 0.0f;
        for (int j = 0; j < rows * cols; ++j) s += x[j];
        y[0] = s / (rows * cols);
    }
}
