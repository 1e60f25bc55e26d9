// Row argmin and row sum, one thread per row: the smallest value's first column (from +inf, column 0 where no
// value is below it), then the sum of the row.
__global__ void kernel(const float* __restrict__ x, int* __restrict__ low_at, float* __restrict__ total,
                       int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float low = INFINITY;
    int at = 0;
    for (int j = 0; j < n; ++j) {
        if (low > in[j]) {
            at = j;
            low = in[j];
        }
    }
    float s = 0.0f;
    for (int j = 0; j < n; ++j) {
        s += in[j];
    }
    low_at[row] = at;
    total[row] = s;
}
