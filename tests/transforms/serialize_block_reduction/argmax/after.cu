// Weighted row argmax, one thread per row: the row's largest x[j] * w[j] and the first column that holds it.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ peak,
                       long long* __restrict__ where, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float top = in[0] * w[0];
    long long top_at = 0;
    for (int j = 1; j < n; ++j) {
        const float v = in[j] * w[j];
        if (v > top) {
            top = v;
            top_at = j;
        }
    }
    peak[row] = top;
    where[row] = top_at;
}
