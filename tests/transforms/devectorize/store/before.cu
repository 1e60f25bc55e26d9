// A 128-bit store of 8 bf16 through a cast expression, staged through shared memory (as in the GEMM
// epilogue): the shared-memory load stays a vector access, the global store is split.
#include <cuda_bf16.h>

constexpr int THREADS = 128;

__global__ void kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int n)
{
    __shared__ __align__(16) __nv_bfloat16 stage[8 * THREADS];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int e = 0; e < 8; ++e) stage[8 * threadIdx.x + e] = 8 * i + e < n ? x[8 * i + e] : __float2bfloat16(0.0f);
    if (8 * i + 8 <= n) {
        const uint4 v = *reinterpret_cast<const uint4*>(stage + 8 * threadIdx.x);
        *reinterpret_cast<uint4*>(y + 8 * i) = v;
    }
}
