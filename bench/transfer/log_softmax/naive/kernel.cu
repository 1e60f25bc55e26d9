// Naive log-softmax: one thread per row, three passes (max, sum of exponentials, store).
__global__ void log_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = fmaxf(m, in[j]);
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += expf(in[j] - m);
    float shift = m + logf(s);
    for (int j = 0; j < cols; ++j) y[(long long)row * cols + j] = in[j] - shift;
}
