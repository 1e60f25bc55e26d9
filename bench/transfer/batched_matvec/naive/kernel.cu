// Naive batched matvec: one thread per output (batch b, row i) walks its row of A.
__global__ void batched_matvec(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y,
                               int outputs, int m, int k) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= outputs) return;
    const float* xb = x + (long long)(row / m) * k;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += a[(long long)row * k + j] * xb[j];
    y[row] = acc;
}
