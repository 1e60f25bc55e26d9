// Row softmax, one thread per row: three passes over the row (max, sum of exponentials, store).
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float m = -INFINITY;
    for (int j = 0; j < n; ++j) {
        m = fmaxf(m, in[j]);
    }
    float s = 0.0f;
    for (int j = 0; j < n; ++j) {
        s += expf(in[j] - m);
    }
    for (int j = 0; j < n; ++j) {
        y[(long long)row * n + j] = expf(in[j] - m) / s;
    }
}
