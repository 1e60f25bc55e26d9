// ldmatrix.x1 with the .shared::cta state space and a "memory" clobber, in a helper that does more
// than the load: only lanes 0-7 supply addresses.
#include <cstdint>

__device__ __forceinline__ uint32_t load_row_pair(uint32_t smem_addr, uint32_t bias)
{
    uint32_t r;
    // scalarized asm volatile (clobbers "memory"): ldmatrix.sync.aligned.m8n8.x1.shared::cta.b16 {r}, [smem_addr];
    {
        // Lane l receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1, of matrix j (one 32-bit word);
        // lane 8 j + l / 4 holds that row's address.
        const unsigned ldsm_addr = smem_addr;
        const int ldsm_lane = threadIdx.x & 31;
        const int ldsm_src = ldsm_lane >> 2;
        const unsigned ldsm_col = 4u * (ldsm_lane & 3);
        r = *static_cast<const unsigned*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, ldsm_src) + ldsm_col));
    }
    return r + bias;
}

extern "C" __global__ void kernel(const uint4* __restrict__ tile, uint32_t* __restrict__ out)
{
    __shared__ __align__(16) uint4 rows[8];
    if (threadIdx.x < 8) rows[threadIdx.x] = tile[threadIdx.x];
    __syncthreads();
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(rows));
    out[threadIdx.x] = load_row_pair(base + ((threadIdx.x & 7) ^ 5) * 16, 0u);  // rows in a permuted order
}
