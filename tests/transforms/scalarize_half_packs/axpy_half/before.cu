#include <cuda_fp16.h>

// z = a * x + y over half precision data, computed in float; one thread per element.
__global__ void kernel(const __half* __restrict__ x, const __half* __restrict__ y, __half* __restrict__ z, float a,
                       int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 7 < n && (((size_t)x | (size_t)y | (size_t)z) & 15) == 0) {
        const uint4 x8 = *reinterpret_cast<const uint4*>(x + i);
        const __half* x8h = reinterpret_cast<const __half*>(&x8);
        const uint4 y8 = *reinterpret_cast<const uint4*>(y + i);
        const __half* y8h = reinterpret_cast<const __half*>(&y8);
        uint4 z8;
        __half* z8h = reinterpret_cast<__half*>(&z8);
        { z8h[0] = __float2half(a * __half2float(x8h[0]) + __half2float(y8h[0])); }
        { z8h[1] = __float2half(a * __half2float(x8h[1]) + __half2float(y8h[1])); }
        { z8h[2] = __float2half(a * __half2float(x8h[2]) + __half2float(y8h[2])); }
        { z8h[3] = __float2half(a * __half2float(x8h[3]) + __half2float(y8h[3])); }
        { z8h[4] = __float2half(a * __half2float(x8h[4]) + __half2float(y8h[4])); }
        { z8h[5] = __float2half(a * __half2float(x8h[5]) + __half2float(y8h[5])); }
        { z8h[6] = __float2half(a * __half2float(x8h[6]) + __half2float(y8h[6])); }
        { z8h[7] = __float2half(a * __half2float(x8h[7]) + __half2float(y8h[7])); }
        *reinterpret_cast<uint4*>(z + i) = z8;
    } else {
        for (int e = i; e < n && e < i + 8; ++e) z[e] = __float2half(a * __half2float(x[e]) + __half2float(y[e]));
    }
}
