// Row argmin and row sum, one thread per row: the smallest value's first column (from +inf, column 0 where no
// value is below it), then the sum of the row.
__global__ void kernel(const float* __restrict__ x, int* __restrict__ low_at, float* __restrict__ total,
                       int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float low = INFINITY;
    int at = 0;
    for (int j = lane; j < n; j += 32) {
        if (low > in[j]) {
            at = j;
            low = in[j];
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float pair_value = __shfl_xor_sync(0xffffffffu, low, offset);
        const int pair_index = __shfl_xor_sync(0xffffffffu, at, offset);
        if (pair_value < low || (pair_value == low && pair_index < at)) {
            low = pair_value;
            at = pair_index;
        }
    }
    float s = 0.0f;
    for (int j = lane; j < n; j += 32) {
        s += in[j];
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    low_at[row] = at;
    total[row] = s;
}
