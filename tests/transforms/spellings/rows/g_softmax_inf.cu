#include <math.h>
__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float m = -INFINITY;
        for (int j = 0; j < cols; ++j) m = fmaxf(m, x[row * cols + j]);
        float s = 0.0f;
        for (int j = 0; j < cols; ++j) s += expf(x[row * cols + j] - m);
        for (int j = 0; j < cols; ++j) y[row * cols + j] = expf(x[row * cols + j] - m) / s;
    }
}
