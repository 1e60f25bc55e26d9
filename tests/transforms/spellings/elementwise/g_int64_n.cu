#include <cstdint>
__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = log1pf(expf(x[i])); }
}
