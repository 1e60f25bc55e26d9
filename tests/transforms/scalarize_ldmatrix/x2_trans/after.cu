// ldmatrix.x2.trans: two 8 x 8 f16 matrices of a row-major k x n tile, transposed on the way into
// registers (the mma B-fragment layout from a row-major B). Non-volatile asm, a lane-local address.
#include <cstdint>

__device__ __forceinline__ void load_b_trans(uint32_t& b0, uint32_t& b1, const void* row)
{
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    // scalarized asm: ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {b0, b1}, [addr];
    {
        // .trans: lane l receives element l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 of matrix j
        // (16 bits each, the first row in the low half); lanes 8 j + 2 (l % 4) and
        // 8 j + 2 (l % 4) + 1 hold those two row addresses.
        const unsigned ldsm_addr = addr;
        const int ldsm_lane = threadIdx.x & 31;
        const int ldsm_src = 2 * (ldsm_lane & 3);
        const unsigned ldsm_col = 2u * (ldsm_lane >> 2);
        const unsigned ldsm_lo0 = *static_cast<const unsigned short*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, ldsm_src) + ldsm_col));
        const unsigned ldsm_hi0 = *static_cast<const unsigned short*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, ldsm_src + 1) + ldsm_col));
        b0 = ldsm_lo0 | (ldsm_hi0 << 16);
        const unsigned ldsm_lo1 = *static_cast<const unsigned short*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, 8 + ldsm_src) + ldsm_col));
        const unsigned ldsm_hi1 = *static_cast<const unsigned short*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, 8 + ldsm_src + 1) + ldsm_col));
        b1 = ldsm_lo1 | (ldsm_hi1 << 16);
    }
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
