// Weighted row argmax, one thread per row: the row's largest x[j] * w[j] and the first column that holds it.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ peak,
                       long long* __restrict__ where, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float top = in[0] * w[0];
    long long top_at = 0;
    for (int j = 1 + lane; j < n; j += 32) {
        const float v = in[j] * w[j];
        if (v > top) {
            top = v;
            top_at = j;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float pair_value = __shfl_xor_sync(0xffffffffu, top, offset);
        const long long pair_index = __shfl_xor_sync(0xffffffffu, top_at, offset);
        if (pair_value > top || (pair_value == top && pair_index < top_at)) {
            top = pair_value;
            top_at = pair_index;
        }
    }
    peak[row] = top;
    where[row] = top_at;
}
