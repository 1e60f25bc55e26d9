__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = x + r * cols;
    int best = 0;
    for (int c = 1; c < cols; ++c)
        if (row[c] < row[best]) best = c;
    y[r] = (float)best;
}
