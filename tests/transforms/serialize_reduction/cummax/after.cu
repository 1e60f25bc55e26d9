// Running maximum of each row (torch.cummax's values), one thread per row, and the row's maximum after the scan.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ total, int rows,
                       int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float running = -INFINITY;
    for (int j = 0; j < n; ++j) {
        running = fmaxf(running, x[row * n + j]);
        y[row * n + j] = running;
    }
    total[row] = running;
}
