// Each row's largest element and its sum, over the rows of a batch of matrices: the matrix on grid y, the row along x.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int batch, int rows, int cols) {
    int b = blockIdx.y;
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float best = -INFINITY;
        for (int j = 0; j < cols; ++j) best = fmaxf(best, x[(b * rows + row) * cols + j]);
        float sum = 0.0f;
        for (int j = 0; j < cols; ++j) sum += x[(b * rows + row) * cols + j];
        y[2 * (b * rows + row)] = best;
        y[2 * (b * rows + row) + 1] = sum;
    }
}
