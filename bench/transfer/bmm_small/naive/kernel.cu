// Naive batched product: one thread per output element, one layer of blocks per matrix of the batch.
__global__ void bmm(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int m, int n,
                    int k) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int batch = blockIdx.z;
    if (row < m && col < n) {
        float sum = 0.0f;
        for (int i = 0; i < k; ++i) sum += a[batch * m * k + row * k + i] * b[batch * k * n + i * n + col];
        c[batch * m * n + row * n + col] = sum;
    }
}
