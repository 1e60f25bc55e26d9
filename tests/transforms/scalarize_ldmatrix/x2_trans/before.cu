// ldmatrix.x2.trans: two 8 x 8 f16 matrices of a row-major k x n tile, transposed on the way into
// registers (the mma B-fragment layout from a row-major B). Non-volatile asm, a lane-local address.
#include <cstdint>

__device__ __forceinline__ void load_b_trans(uint32_t& b0, uint32_t& b1, const void* row)
{
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
        : "=r"(b0), "=r"(b1)
        : "r"(addr));
}

extern "C" __global__ void kernel(const uint4* __restrict__ tile, uint32_t* __restrict__ out)
{
    __shared__ __align__(16) uint4 rows[16];  // 16 rows (k) of 8 f16 (n)
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 16) rows[threadIdx.x] = tile[threadIdx.x];
    __syncthreads();
    uint32_t b0, b1;
    load_b_trans(b0, b1, &rows[lane % 16]);  // lanes 0-15 give the 16 row addresses; 16-31 are ignored
    out[threadIdx.x * 2] = b0;
    out[threadIdx.x * 2 + 1] = b1;
}
