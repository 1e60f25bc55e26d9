#include <cuda_fp16.h>

// Rows of a half matrix picked by an index array and scaled: dst[r, :] = src[perm[r], :] * gain.
__global__ void kernel(const __half* __restrict__ src, const int* __restrict__ perm, __half* __restrict__ dst,
                       float gain, long long n, int width) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const int row = i / width, col = i % width;
        dst[i] = __float2half(__half2float(src[(long long)perm[row] * width + col]) * gain);
    }
}
