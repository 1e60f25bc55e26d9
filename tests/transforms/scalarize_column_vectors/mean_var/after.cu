// A column's mean and variance in two passes; an integer count of the rows that are not below the mean.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ mean, float* __restrict__ var,
                       int* __restrict__ above, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float sum = 0.0f;
        for (int r = 0; r < rows; ++r) {
            sum += x[r * cols + c];
        }
        const float m = rows > 0 ? sum / rows : 0.0f;
        float squares = 0.0f;
        int count = 0;
        for (int r = 0; r < rows; ++r) {
            const float d = x[r * cols + c] - m;
            squares = fmaf(d, d, squares);
            count += d >= 0.0f ? 1 : 0;
        }
        mean[c] = m;
        var[c] = rows > 1 ? squares / (rows - 1) : 0.0f;
        above[c] = count;
    }
}
