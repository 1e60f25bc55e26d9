// A bias gradient: one thread per column adds up its column, row after row.
__global__ void kernel(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float sum = 0.0f;
        for (int r = 0; r < rows; r++) {
            sum += dy[(size_t)r * cols + c];
        }
        db[c] = sum;
    }
}
