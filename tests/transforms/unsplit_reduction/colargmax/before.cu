// Column argmax, one thread per column: the column's largest value and the first row that holds it.
constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS) kernel(const float* __restrict__ x, float* __restrict__ values,
                                                  long long* __restrict__ rows_at, int rows, int cols, int split_steps, float* __restrict__ split_best, long long* __restrict__ split_at) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float best = x[c];
    long long at = 0;
    const int split_first = (int)blockIdx.y * split_steps;
    for (int r = split_first < 1 ? 1 : split_first; r < rows && r < split_first + split_steps; ++r) {
        const float v = x[(long long)r * cols + c];
        if (v > best) {
            best = v;
            at = r;
        }
    }
    split_best[(size_t)blockIdx.y * cols + c] = best;
    split_at[(size_t)blockIdx.y * cols + c] = at;
}

__global__ void __launch_bounds__(THREADS) kernel_merge(const float* __restrict__ x, float* __restrict__ values,
                                                  long long* __restrict__ rows_at, int rows, int cols, int split_steps, const float* __restrict__ split_best, const long long* __restrict__ split_at) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float best = x[c];
    long long at = 0;
    for (int split = 0; split < (rows + split_steps - 1) / split_steps; ++split) {
        const float split_value = split_best[(size_t)split * cols + c];
        const long long split_index = split_at[(size_t)split * cols + c];
        if (split_value > best || (split_value == best && split_index < at)) {
            best = split_value;
            at = split_index;
        }
    }
    values[c] = best;
    rows_at[c] = at;
}
