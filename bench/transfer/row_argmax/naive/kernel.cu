// Naive row argmax: one thread per row scans its row.
__global__ void row_argmax(const float* __restrict__ x, float* __restrict__ value, long long* __restrict__ index,
                           int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float best = in[0];
    long long at = 0;
    for (int j = 1; j < cols; ++j) {
        if (in[j] > best) {
            best = in[j];
            at = j;
        }
    }
    value[row] = best;
    index[row] = at;
}
