// The bf16 MMA of bf16/, written in a layout other than the canonical one: the template string split
// at every operand group with uneven indentation, no spaces inside the groups, operand lines
// aligned their own way and a blank line inside the statement. backward records the statement
// verbatim in its marker, and forward restores it byte for byte.
#include <cuda_bf16.h>
#include <cstdint>

__device__ __forceinline__ void mma_split(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    // scalarized asm volatile: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
    //     {d[0], d[1], d[2], d[3]}, {a[0], a[1], a[2], a[3]}, {b[0], b[1]}, {d[0], d[1], d[2], d[3]};
    //     verbatim: asm volatile(
    //     verbatim:     "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
    //     verbatim:       "{%0,%1,%2,%3}, "
    //     verbatim:       "{%4,%5,%6,%7}, {%8,%9}, "
    //     verbatim:     "{%0,%1,%2,%3};\n"
    //     verbatim:
    //     verbatim:         :   "+f"(d[0]), "+f"(d[1]),
    //     verbatim:             "+f"(d[2]), "+f"(d[3])
    //     verbatim:   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),
    //     verbatim:     "r"(b[0]),   "r"(b[1])
    //     verbatim: );
    {
        // D = A B + C on a 16 x 8 x 16 tile in fp32, k = 0 .. 15 in order. Lane l holds D rows l / 4
        // and l / 4 + 8, columns 2 (l % 4) and 2 (l % 4) + 1. A row r, k = 8 h + 2 t + {0, 1} is in
        // register 2 h + r / 8 of lane 4 (r % 8) + t; B column n, the same k, in register h of lane
        // 4 n + t (the lower k in the low 16 bits).
        const int mma_lane = threadIdx.x & 31;
        const int mma_row_src = mma_lane & ~3;       // lane 4 (l / 4): A rows l / 4 and l / 4 + 8
        const int mma_col_src = 8 * (mma_lane & 3);  // lane 4 * 2 (l % 4): B column 2 (l % 4)
        const unsigned mma_a0 = a[0];
        const unsigned mma_a1 = a[1];
        const unsigned mma_a2 = a[2];
        const unsigned mma_a3 = a[3];
        const unsigned mma_b0 = b[0];
        const unsigned mma_b1 = b[1];
        float mma_d0 = d[0];
        float mma_d1 = d[1];
        float mma_d2 = d[2];
        float mma_d3 = d[3];
        for (int mma_h = 0; mma_h < 2; ++mma_h) {  // k = 0 .. 7, then 8 .. 15
            const unsigned mma_a_top = mma_h == 0 ? mma_a0 : mma_a2;  // A row l / 4
            const unsigned mma_a_bottom = mma_h == 0 ? mma_a1 : mma_a3;  // A row l / 4 + 8
            const unsigned mma_b_half = mma_h == 0 ? mma_b0 : mma_b1;
            for (int mma_t = 0; mma_t < 4; ++mma_t) {  // k = 8 h + 2 t and 8 h + 2 t + 1
                const unsigned mma_top = __shfl_sync(0xffffffffu, mma_a_top, mma_row_src + mma_t);
                const unsigned mma_bottom = __shfl_sync(0xffffffffu, mma_a_bottom, mma_row_src + mma_t);
                const unsigned mma_left = __shfl_sync(0xffffffffu, mma_b_half, mma_col_src + mma_t);
                const unsigned mma_right = __shfl_sync(0xffffffffu, mma_b_half, mma_col_src + 4 + mma_t);
                for (int mma_e = 0; mma_e < 2; ++mma_e) {  // k = 8 h + 2 t + e
                    const int mma_shift = 16 * mma_e;
                    const float mma_at = __bfloat162float(
                        __ushort_as_bfloat16(static_cast<unsigned short>(mma_top >> mma_shift)));
                    const float mma_ab = __bfloat162float(
                        __ushort_as_bfloat16(static_cast<unsigned short>(mma_bottom >> mma_shift)));
                    const float mma_bl = __bfloat162float(
                        __ushort_as_bfloat16(static_cast<unsigned short>(mma_left >> mma_shift)));
                    const float mma_br = __bfloat162float(
                        __ushort_as_bfloat16(static_cast<unsigned short>(mma_right >> mma_shift)));
                    mma_d0 = fmaf(mma_at, mma_bl, mma_d0);
                    mma_d1 = fmaf(mma_at, mma_br, mma_d1);
                    mma_d2 = fmaf(mma_ab, mma_bl, mma_d2);
                    mma_d3 = fmaf(mma_ab, mma_br, mma_d3);
                }
            }
        }
        d[0] = mma_d0;
        d[1] = mma_d1;
        d[2] = mma_d2;
        d[3] = mma_d3;
    }
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
