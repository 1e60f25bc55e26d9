#include <cuda_fp16.h>

// A residual add with a bias over half data, one thread per element of tokens x hidden: bias[h] is one value per
// channel (the last dimension).
__global__ void kernel(const __half* __restrict__ x, const __half* __restrict__ residual,
                       const __half* __restrict__ bias, __half* __restrict__ y, long long n, int hidden) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    if (hidden % 8 == 0 && i + 7 < n && (((size_t)x | (size_t)residual | (size_t)bias | (size_t)y) & 15) == 0) {
        const int h = i % hidden;
        const uint4 x8 = *reinterpret_cast<const uint4*>(x + i);
        const __half* x8h = reinterpret_cast<const __half*>(&x8);
        const uint4 residual8 = *reinterpret_cast<const uint4*>(residual + i);
        const __half* residual8h = reinterpret_cast<const __half*>(&residual8);
        const uint4 bias8 = *reinterpret_cast<const uint4*>(bias + h);
        const __half* bias8h = reinterpret_cast<const __half*>(&bias8);
        uint4 y8;
        __half* y8h = reinterpret_cast<__half*>(&y8);
        y8h[0] = __float2half(__half2float(x8h[0]) + __half2float(residual8h[0]) + __half2float(bias8h[0]));
        y8h[1] = __float2half(__half2float(x8h[1]) + __half2float(residual8h[1]) + __half2float(bias8h[1]));
        y8h[2] = __float2half(__half2float(x8h[2]) + __half2float(residual8h[2]) + __half2float(bias8h[2]));
        y8h[3] = __float2half(__half2float(x8h[3]) + __half2float(residual8h[3]) + __half2float(bias8h[3]));
        y8h[4] = __float2half(__half2float(x8h[4]) + __half2float(residual8h[4]) + __half2float(bias8h[4]));
        y8h[5] = __float2half(__half2float(x8h[5]) + __half2float(residual8h[5]) + __half2float(bias8h[5]));
        y8h[6] = __float2half(__half2float(x8h[6]) + __half2float(residual8h[6]) + __half2float(bias8h[6]));
        y8h[7] = __float2half(__half2float(x8h[7]) + __half2float(residual8h[7]) + __half2float(bias8h[7]));
        *reinterpret_cast<uint4*>(y + i) = y8;
    } else {
        for (long long e = i; e < n && e < i + 8; ++e) {
            const int h = e % hidden;
            y[e] = __float2half(__half2float(x[e]) + __half2float(residual[e]) + __half2float(bias[h]));
        }
    }
}
