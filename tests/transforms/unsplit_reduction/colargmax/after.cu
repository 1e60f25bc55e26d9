// Column argmax, one thread per column: the column's largest value and the first row that holds it.
constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS) kernel(const float* __restrict__ x, float* __restrict__ values,
                                                  long long* __restrict__ rows_at, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float best = x[c];
    long long at = 0;
    for (int r = 1; r < rows; ++r) {
        const float v = x[(long long)r * cols + c];
        if (v > best) {
            best = v;
            at = r;
        }
    }
    values[c] = best;
    rows_at[c] = at;
}
