#include <cuda_fp16.h>

// Rows of a half matrix picked by an index array and scaled: dst[r, :] = src[perm[r], :] * gain.
__global__ void kernel(const __half* __restrict__ src, const int* __restrict__ perm, __half* __restrict__ dst,
                       float gain, long long n, int width) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i < n) {
        if (width % 8 == 0 && i + 7 < n && (((size_t)src | (size_t)dst) & 15) == 0) {
            const int row = i / width, col = i % width;
            const uint4 src8 = *reinterpret_cast<const uint4*>(src + ((long long)perm[row] * width + col));
            const __half* src8h = reinterpret_cast<const __half*>(&src8);
            uint4 dst8;
            __half* dst8h = reinterpret_cast<__half*>(&dst8);
            dst8h[0] = __float2half(__half2float(src8h[0]) * gain);
            dst8h[1] = __float2half(__half2float(src8h[1]) * gain);
            dst8h[2] = __float2half(__half2float(src8h[2]) * gain);
            dst8h[3] = __float2half(__half2float(src8h[3]) * gain);
            dst8h[4] = __float2half(__half2float(src8h[4]) * gain);
            dst8h[5] = __float2half(__half2float(src8h[5]) * gain);
            dst8h[6] = __float2half(__half2float(src8h[6]) * gain);
            dst8h[7] = __float2half(__half2float(src8h[7]) * gain);
            *reinterpret_cast<uint4*>(dst + i) = dst8;
        } else {
            for (long long e = i; e < n && e < i + 8; ++e) {
                const int row = e / width, col = e % width;
                dst[e] = __float2half(__half2float(src[(long long)perm[row] * width + col]) * gain);
            }
        }
    }
}
