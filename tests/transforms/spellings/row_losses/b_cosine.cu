// Mean cosine-similarity loss: three sums over the row in one loop, then the row's term.
__global__ void row_loss(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ loss,
                         int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float dot = 0.0f, na = 0.0f, nb = 0.0f;
        for (int j = 0; j < cols; j++) {
            dot += a[row * cols + j] * b[row * cols + j];
            na += a[row * cols + j] * a[row * cols + j];
            nb += b[row * cols + j] * b[row * cols + j];
        }
        float cosine = dot / fmaxf(sqrtf(na) * sqrtf(nb), 1e-8f);
        atomicAdd(loss, (1.0f - cosine) / rows);
    }
}
