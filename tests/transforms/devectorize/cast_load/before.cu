// A 128-bit load of 8 bf16 through a cast expression: four 32-bit loads of the same bytes.
#include <cuda_bf16.h>

__global__ void kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (8 * i + 8 <= n) {
        const uint4 v = *reinterpret_cast<const uint4*>(x + 8 * i);
        *reinterpret_cast<uint4*>(y + 8 * i) = v;
    }
}
