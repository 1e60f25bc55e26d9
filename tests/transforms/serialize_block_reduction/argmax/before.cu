// Weighted row argmax, one thread per row: the row's largest x[j] * w[j] and the first column that holds it.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ peak,
                       long long* __restrict__ where, int rows, int n) {
    int row = blockIdx.x;
    const int lane = threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float top = in[0] * w[0];
    long long top_at = 0;
    for (int j = 1 + lane; j < n; j += 256) {
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
    {
        __shared__ float block_top[8];
        __shared__ long long block_top_at[8];
        if (lane % 32 == 0) {
            block_top[lane / 32] = top;
            block_top_at[lane / 32] = top_at;
        }
        __syncthreads();
        top = block_top[0];
        top_at = block_top_at[0];
        for (int block_warp = 1; block_warp < 8; ++block_warp) {
            if (block_top[block_warp] > top || (block_top[block_warp] == top && block_top_at[block_warp] < top_at)) {
                top = block_top[block_warp];
                top_at = block_top_at[block_warp];
            }
        }
        __syncthreads();
    }
    peak[row] = top;
    where[row] = top_at;
}
