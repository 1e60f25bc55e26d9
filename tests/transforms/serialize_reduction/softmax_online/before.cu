// Row softmax, one thread per row, the normalizer in one pass: a running maximum and the sum of exponentials
// rescaled to it, then the store.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float m = -INFINITY;
    float s = 0.0f;
    for (int j = lane; j < n; j += 32) {
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
    for (int j = lane; j < n; j += 32) y[row * n + j] = expf(x[row * n + j] - m) / s;
}
