#include <cuda_fp16.h>

// y = a * x + y in place over half precision data, computed in float; one thread per element.
__global__ void kernel(const __half* __restrict__ x, __half* __restrict__ y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(a * __half2float(x[i]) + __half2float(y[i]));
}
