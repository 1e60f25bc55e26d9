// The ldmatrix.x4 of x4/, written in a layout other than the canonical one: the template string
// split after the opcode and after the registers, early-clobber outputs ("=&r", which the canonical
// form writes "=r"), one output per line and the input under the colon. backward records the
// statement verbatim in its marker, and forward restores it byte for byte.
#include <cstdint>

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16"
                 " {%0, %1, %2, %3},"
                 " [%4];\n"
        : "=&r"(r[0]),
          "=&r"(r[1]),
          "=&r"(r[2]),
          "=&r"(r[3])
        :  "r"(smem_addr));
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
