// A 128-bit load of 8 bf16 through a cast expression: four 32-bit loads of the same bytes.
#include <cuda_bf16.h>

__global__ void kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (8 * i + 8 <= n) {
        const uint4 v = make_uint4(reinterpret_cast<const unsigned int*>(x + 8 * i)[0],
                reinterpret_cast<const unsigned int*>(x + 8 * i)[1],
                reinterpret_cast<const unsigned int*>(x + 8 * i)[2],
                reinterpret_cast<const unsigned int*>(x + 8 * i)[3]);
        *reinterpret_cast<uint4*>(y + 8 * i) = v;
    }
}
