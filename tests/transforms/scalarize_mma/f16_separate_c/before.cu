// One m16n8k16 f16 MMA per warp with separate accumulator input and output ("=f" outputs, "f" C
// inputs), non-volatile asm, fragments passed as scalars.
#include <cuda_fp16.h>
#include <cstdint>

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1, const float (&c)[4])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

extern "C" __global__ void kernel(const uint32_t* __restrict__ frags, const float* __restrict__ c,
                                  float* __restrict__ out)
{
    const int t = threadIdx.x;
    const uint32_t* f = frags + t * 6;
    float acc[4] = {c[t * 4], c[t * 4 + 1], c[t * 4 + 2], c[t * 4 + 3]};
    float d[4];
    mma_f16(d, f[0], f[1], f[2], f[3], f[4], f[5], acc);
    for (int i = 0; i < 4; ++i) out[t * 4 + i] = d[i];
}
