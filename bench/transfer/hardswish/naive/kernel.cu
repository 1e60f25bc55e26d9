// Naive hard swish, as a PyTorch extension writes it: a template over the element type, one thread per element.
#include <cstdint>

template <typename scalar_t>
__global__ void hardswish_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, const int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        const scalar_t v = x[i];
        const scalar_t r6 = min(max(v + scalar_t(3), scalar_t(0)), scalar_t(6));
        y[i] = v * r6 / scalar_t(6);
    }
}

template __global__ void hardswish_kernel<float>(const float* __restrict__, float* __restrict__, const int64_t);
