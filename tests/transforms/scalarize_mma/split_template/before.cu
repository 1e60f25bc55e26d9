// The bf16 MMA of bf16/, written in a layout other than the canonical one: the template string split
// at every operand group with uneven indentation, no spaces inside the groups, operand lines
// aligned their own way and a blank line inside the statement. backward records the statement
// verbatim in its marker, and forward restores it byte for byte.
#include <cuda_bf16.h>
#include <cstdint>

__device__ __forceinline__ void mma_split(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
          "{%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"

            :   "+f"(d[0]), "+f"(d[1]),
                "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),
        "r"(b[0]),   "r"(b[1])
    );
}

extern "C" __global__ void kernel(const uint32_t* __restrict__ frags, const float* __restrict__ c,
                                  float* __restrict__ out)
{
    const int t = threadIdx.x;
    uint32_t a[4], b[2];
    float d[4];
    for (int i = 0; i < 4; ++i) a[i] = frags[t * 6 + i];
    for (int i = 0; i < 2; ++i) b[i] = frags[t * 6 + 4 + i];
    for (int i = 0; i < 4; ++i) d[i] = c[t * 4 + i];
    mma_split(d, a, b);
    for (int i = 0; i < 4; ++i) out[t * 4 + i] = d[i];
}
