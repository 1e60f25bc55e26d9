// Exclusive prefix sum of each row (each element the sum of those before it), one thread per row, and the row total.
__global__ void kernel(const int* __restrict__ x, int* __restrict__ y, int* __restrict__ total, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int running = 0;
    for (int scan_base = 0; scan_base < n; scan_base += 32) {
        const int j = scan_base + lane;
        int scan_value = 0;
        if (j < n) scan_value = x[row * n + j];
        for (int offset = 1; offset < 32; offset *= 2) {
            const int scan_up = __shfl_up_sync(0xffffffffu, scan_value, offset);
            if (lane >= offset) scan_value += scan_up;
        }
        const int scan_before = __shfl_up_sync(0xffffffffu, scan_value, 1);
        if (j < n) y[row * n + j] = lane == 0 ? running : running + scan_before;
        running += __shfl_sync(0xffffffffu, scan_value, 31);
    }
    total[row] = running;
}
