// Prefix sum of each row from its end (torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1])), one thread per row,
// and the row total after the scan.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ total, int rows,
                       int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float running = 0.0f;
    for (int j = n - 1; j >= 0; --j) {
        running += x[row * n + j];
        y[row * n + j] = running;
    }
    total[row] = running;
}
