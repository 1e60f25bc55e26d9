// Exclusive prefix sum of each row (each element the sum of those before it), one thread per row, and the row total.
__global__ void kernel(const int* __restrict__ x, int* __restrict__ y, int* __restrict__ total, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    int running = 0;
    for (int j = 0; j < n; ++j) {
        y[row * n + j] = running;
        running += x[row * n + j];
    }
    total[row] = running;
}
