// Sum and sum of squares of each row (one thread per row), a braceless loop and an integer count.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int n) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float sum = 0.0f, squares = 0.f;
        int count = 0;
        for (int j = 0; j < n; ++j) {
            float v = x[row * n + j];
            sum += v;
            squares += v * v;
            count += v > 0.0f;
        }
        out[2 * row] = sum / n;
        out[2 * row + 1] = squares - sum * sum / n + count;
    }
}
