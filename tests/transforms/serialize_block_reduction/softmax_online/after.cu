// Row softmax, one thread per row, the normalizer in one pass: a running maximum and the sum of exponentials
// rescaled to it, then the store.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float m = -INFINITY;
    float s = 0.0f;
    for (int j = 0; j < n; ++j) {
        float v = x[row * n + j];
        float m_new = fmaxf(m, v);
        s = s * expf(m - m_new) + expf(v - m_new);
        m = m_new;
    }
    for (int j = 0; j < n; ++j) y[row * n + j] = expf(x[row * n + j] - m) / s;
}
