// Prefix sum of each row from its end (torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1])), one thread per row,
// and the row total after the scan.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ total, int rows,
                       int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float running = 0.0f;
    for (int scan_base = 0; scan_base < n; scan_base += 32) {
        const int j = n - 1 - (scan_base + lane);
        float scan_value = 0;
        if (j >= 0) scan_value = x[row * n + j];
        for (int offset = 1; offset < 32; offset *= 2) {
            const float scan_up = __shfl_up_sync(0xffffffffu, scan_value, offset);
            if (lane >= offset) scan_value += scan_up;
        }
        if (j >= 0) y[row * n + j] = running + scan_value;
        running += __shfl_sync(0xffffffffu, scan_value, 31);
    }
    total[row] = running;
}
