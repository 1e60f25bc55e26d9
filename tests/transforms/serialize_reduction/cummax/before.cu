// Running maximum of each row (torch.cummax's values), one thread per row, and the row's maximum after the scan.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ total, int rows,
                       int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float running = -INFINITY;
    for (int scan_base = 0; scan_base < n; scan_base += 32) {
        const int j = scan_base + lane;
        float scan_value = __int_as_float(0x7fc00000);
        if (j < n) scan_value = x[row * n + j];
        for (int offset = 1; offset < 32; offset *= 2) {
            const float scan_up = __shfl_up_sync(0xffffffffu, scan_value, offset);
            if (lane >= offset) scan_value = fmaxf(scan_value, scan_up);
        }
        if (j < n) y[row * n + j] = fmaxf(running, scan_value);
        running = fmaxf(running, __shfl_sync(0xffffffffu, scan_value, 31));
    }
    total[row] = running;
}
