#define AT(r, c, C) ((r) * (C) + (c))
#define SQUARE(v) ((v) * (v))
__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float ss = 0.0f;
        for (int j = 0; j < cols; ++j) ss += SQUARE(x[AT(row, j, cols)]);
        float s = rsqrtf(ss / cols + 1e-6f);
        for (int j = 0; j < cols; ++j) y[AT(row, j, cols)] = x[AT(row, j, cols)] * s * w[j];
    }
}
