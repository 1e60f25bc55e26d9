#include <cstdint>
__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int64_t row = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float ss = 0.0f;
    for (int64_t j = 0; j < cols; j += 1) { ss = ss + x[row * cols + j] * x[row * cols + j]; }
    float s = rsqrtf(ss / cols + 1e-6f);
    for (int64_t j = 0; j < cols; j += 1) { y[row * cols + j] = x[row * cols + j] * s * w[j]; }
}
