// The ldmatrix.x4 of x4/, written in a layout other than the canonical one: the template string
// split after the opcode and after the registers, early-clobber outputs ("=&r", which the canonical
// form writes "=r"), one output per line and the input under the colon. backward records the
// statement verbatim in its marker, and forward restores it byte for byte.
#include <cstdint>

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr)
{
    // scalarized asm volatile: ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r[0], r[1], r[2], r[3]}, [smem_addr];
    //     verbatim: asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16"
    //     verbatim:              " {%0, %1, %2, %3},"
    //     verbatim:              " [%4];\n"
    //     verbatim:     : "=&r"(r[0]),
    //     verbatim:       "=&r"(r[1]),
    //     verbatim:       "=&r"(r[2]),
    //     verbatim:       "=&r"(r[3])
    //     verbatim:     :  "r"(smem_addr));
    {
        // Lane l receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1, of matrix j (one 32-bit word);
        // lane 8 j + l / 4 holds that row's address.
        const unsigned ldsm_addr = smem_addr;
        const int ldsm_lane = threadIdx.x & 31;
        const int ldsm_src = ldsm_lane >> 2;
        const unsigned ldsm_col = 4u * (ldsm_lane & 3);
        r[0] = *static_cast<const unsigned*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, ldsm_src) + ldsm_col));
        r[1] = *static_cast<const unsigned*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, 8 + ldsm_src) + ldsm_col));
        r[2] = *static_cast<const unsigned*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, 16 + ldsm_src) + ldsm_col));
        r[3] = *static_cast<const unsigned*>(
            __cvta_shared_to_generic(__shfl_sync(0xffffffffu, ldsm_addr, 24 + ldsm_src) + ldsm_col));
    }
}

extern "C" __global__ void kernel(const uint4* __restrict__ tile, uint32_t* __restrict__ out)
{
    __shared__ __align__(16) uint4 rows[32];  // 16 rows of 16 bf16: two 16-byte chunks per row
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) rows[lane] = tile[lane];
    __syncthreads();
    // Lane l addresses row l % 16, chunk l / 16: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15).
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(rows));
    uint32_t r[4];
    ldmatrix_x4(r, base + (lane % 16) * 32 + (lane / 16) * 16);
    for (int j = 0; j < 4; ++j) out[threadIdx.x * 4 + j] = r[j];
}
