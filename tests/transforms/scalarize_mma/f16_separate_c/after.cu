// One m16n8k16 f16 MMA per warp with separate accumulator input and output ("=f" outputs, "f" C
// inputs), non-volatile asm, fragments passed as scalars.
#include <cuda_fp16.h>
#include <cstdint>

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1, const float (&c)[4])
{
    // scalarized asm: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
    //     {d[0], d[1], d[2], d[3]}, {a0, a1, a2, a3}, {b0, b1}, {c[0], c[1], c[2], c[3]};
    {
        // D = A B + C on a 16 x 8 x 16 tile in fp32, k = 0 .. 15 in order. Lane l holds D rows l / 4
        // and l / 4 + 8, columns 2 (l % 4) and 2 (l % 4) + 1. A row r, k = 8 h + 2 t + {0, 1} is in
        // register 2 h + r / 8 of lane 4 (r % 8) + t; B column n, the same k, in register h of lane
        // 4 n + t (the lower k in the low 16 bits).
        const int mma_lane = threadIdx.x & 31;
        const int mma_row_src = mma_lane & ~3;       // lane 4 (l / 4): A rows l / 4 and l / 4 + 8
        const int mma_col_src = 8 * (mma_lane & 3);  // lane 4 * 2 (l % 4): B column 2 (l % 4)
        const unsigned mma_a0 = a0;
        const unsigned mma_a1 = a1;
        const unsigned mma_a2 = a2;
        const unsigned mma_a3 = a3;
        const unsigned mma_b0 = b0;
        const unsigned mma_b1 = b1;
        float mma_d0 = c[0];
        float mma_d1 = c[1];
        float mma_d2 = c[2];
        float mma_d3 = c[3];
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
                    const float mma_at = __half2float(
                        __ushort_as_half(static_cast<unsigned short>(mma_top >> mma_shift)));
                    const float mma_ab = __half2float(
                        __ushort_as_half(static_cast<unsigned short>(mma_bottom >> mma_shift)));
                    const float mma_bl = __half2float(
                        __ushort_as_half(static_cast<unsigned short>(mma_left >> mma_shift)));
                    const float mma_br = __half2float(
                        __ushort_as_half(static_cast<unsigned short>(mma_right >> mma_shift)));
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
    const uint32_t* f = frags + t * 6;
    float acc[4] = {c[t * 4], c[t * 4 + 1], c[t * 4 + 2], c[t * 4 + 3]};
    float d[4];
    mma_f16(d, f[0], f[1], f[2], f[3], f[4], f[5], acc);
    for (int i = 0; i < 4; ++i) out[t * 4 + i] = d[i];
}
