// Each element's offset named inside the loops, for the reads and for the store.
__global__ void rms_norm(const float* x, const float* w, float* y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float acc = 0.0f;
        for (int j = 0; j < cols; j++) {
            int idx = row * cols + j;
            acc += x[idx] * x[idx];
        }
        float r = rsqrtf(acc / cols + 1e-6f);
        for (int j = 0; j < cols; j++) {
            const int idx = row * cols + j;
            y[idx] = x[idx] * r * w[j];
        }
    }
}
