__global__ void bias_grad(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += blockDim.x * gridDim.x) {
        float s = 0.0f;
        for (int r = 0; r < rows; r++) s += dy[r * cols + c];
        db[c] = s;
    }
}
