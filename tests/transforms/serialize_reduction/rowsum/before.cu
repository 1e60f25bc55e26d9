// Sum and sum of squares of each row (one thread per row), a braceless loop and an integer count.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row < rows) {
        float sum = 0.0f, squares = 0.f;
        int count = 0;
        for (int j = lane; j < n; j += 32) {
            float v = x[row * n + j];
            sum += v;
            squares += v * v;
            count += v > 0.0f;
        }
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
        for (int offset = 16; offset > 0; offset /= 2) count += __shfl_xor_sync(0xffffffffu, count, offset);
        out[2 * row] = sum / n;
        out[2 * row + 1] = squares - sum * sum / n + count;
    }
}
