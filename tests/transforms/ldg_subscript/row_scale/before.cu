// y[r][j] = x[r][j] * w[j] / (1 + the sum of |x| over row r); one thread per row, two passes over it.
__global__ void kernel(const float* __restrict__ x, const float* w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float total = 0.0f;
    for (int j = 0; j < cols; ++j) total += fabsf(__ldg(&in[j]));
    for (int j = 0; j < cols; ++j) y[(long long)row * cols + j] = __ldg(&in[j]) * w[j] / (1.0f + total);
}
