#include <cstdint>
__global__ void rotary(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int pairs) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < pairs) {
        y[2 * i] = fmaf(x[2 * i], cos_t[i], -x[2 * i + 1] * sin_t[i]);
        y[2 * i + 1] = fmaf(x[2 * i], sin_t[i], x[2 * i + 1] * cos_t[i]);
    }
}
