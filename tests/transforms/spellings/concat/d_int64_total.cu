#include <cstdint>
__global__ void concat_last(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                            int rows, int ca, int cb) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t cols = ca + cb;
    const int64_t total = rows * cols;
    if (i >= total) return;
    const int64_t r = i / cols, c = i % cols;
    out[i] = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
}
