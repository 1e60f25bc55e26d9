// Column argmax, one thread per column: the column's largest value and the first row that holds it.
constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS) kernel(const float* __restrict__ x, float* __restrict__ values,
                                                  long long* __restrict__ rows_at, int rows, int cols) {
    int c = (blockIdx.x * blockDim.x + threadIdx.x) / 32 * 8 + threadIdx.x % 8;
    const int slice = threadIdx.x % 32 / 8;
    const unsigned slice_mask = 0x01010101u << (threadIdx.x % 8);
    if (c < cols) {
        float best = x[c];
        long long at = 0;
        for (int r = 1 + slice; r < rows; r += 4) {
            const float v = x[(long long)r * cols + c];
            if (v > best) {
                best = v;
                at = r;
            }
        }
        for (int offset = 16; offset >= 8; offset /= 2) {
            const float pair_value = __shfl_xor_sync(slice_mask, best, offset);
            const long long pair_index = __shfl_xor_sync(slice_mask, at, offset);
            if (pair_value > best || (pair_value == best && pair_index < at)) {
                best = pair_value;
                at = pair_index;
            }
        }
        values[c] = best;
        rows_at[c] = at;
    }
}
