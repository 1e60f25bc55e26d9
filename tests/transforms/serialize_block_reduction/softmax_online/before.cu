// Row softmax, one thread per row, the normalizer in one pass: a running maximum and the sum of exponentials
// rescaled to it, then the store.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = blockIdx.x;
    const int lane = threadIdx.x;
    if (row >= rows) return;
    float m = -INFINITY;
    float s = 0.0f;
    for (int j = lane; j < n; j += 256) {
        float v = x[row * n + j];
        float m_new = fmaxf(m, v);
        s = s * expf(m - m_new) + expf(v - m_new);
        m = m_new;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float pair_max = __shfl_xor_sync(0xffffffffu, m, offset);
        const float pair_sum = __shfl_xor_sync(0xffffffffu, s, offset);
        const float pair_joined = fmaxf(m, pair_max);
        s = (m == pair_joined ? s : s * expf(m - pair_joined)) + (pair_max == pair_joined ? pair_sum : pair_sum * expf(pair_max - pair_joined));
        m = pair_joined;
    }
    {
        __shared__ float block_m[8];
        __shared__ float block_s[8];
        if (lane % 32 == 0) {
            block_m[lane / 32] = m;
            block_s[lane / 32] = s;
        }
        __syncthreads();
        m = block_m[0];
        s = block_s[0];
        for (int block_warp = 1; block_warp < 8; ++block_warp) {
            const float pair_joined = fmaxf(m, block_m[block_warp]);
            s = (m == pair_joined ? s : s * expf(m - pair_joined)) + (block_m[block_warp] == pair_joined ? block_s[block_warp] : block_s[block_warp] * expf(block_m[block_warp] - pair_joined));
            m = pair_joined;
        }
        __syncthreads();
    }
    for (int j = lane; j < n; j += 256) y[row * n + j] = expf(x[row * n + j] - m) / s;
}
