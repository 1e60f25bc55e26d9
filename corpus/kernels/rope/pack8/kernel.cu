// Rotary embedding, tuned for a memory-bound GPU: each thread rotates PACK = 8 element pairs at a
// time with 16-byte loads and stores (eight bf16 of the first half, the matching eight of the second
// half), cached reads of the cos and sin tables, fp32 arithmetic, and a grid-stride loop over the
// packs so that a grid sized to the GPU covers any tensor.
//
// Packs need d / 2 % 8 == 0: then every half-row starts 16-byte aligned.
// Other head sizes take the scalar path: one pair per step of the same grid-stride loop.

#include <cstdint>
#include <cuda_bf16.h>

constexpr int THREADS = 256;
constexpr int PACK = 8;              // element pairs per thread step: 16 bytes of bf16 from each half
constexpr int BLOCKS_PER_SM = 8;     // grid = num_sms * BLOCKS_PER_SM blocks, capped by the work
static_assert(BLOCKS_PER_SM > 0, "the launch plan sizes the grid as num_sms * BLOCKS_PER_SM blocks");
constexpr int UNROLL = 2;            // packs in flight per thread

union Pack16 {                       // 16 bytes: one vector load or store, eight bf16
    uint4 raw;
    __nv_bfloat162 pair[4];
};

// One rotation in fp32: (a, b) -> (a cos - b sin, b cos + a sin).
__device__ __forceinline__ void rotate(float a, float b, float c, float sn, float& ra, float& rb)
{
    ra = fmaf(a, c, -b * sn);
    rb = fmaf(b, c, a * sn);
}

__device__ __forceinline__ void rotate_pack(const __nv_bfloat16* __restrict__ x1p, const __nv_bfloat16* __restrict__ x2p,
                                            const float* __restrict__ cp, const float* __restrict__ sp,
                                            __nv_bfloat16* __restrict__ y1p, __nv_bfloat16* __restrict__ y2p)
{
    Pack16 a, b, ra, rb;
    a.raw = __ldg(reinterpret_cast<const uint4*>(x1p));
    b.raw = __ldg(reinterpret_cast<const uint4*>(x2p));
    // The tables are small (s x d/2 floats, shared by every head and batch): cache hits, read as scalars.
    float cs[PACK], ss[PACK];
#pragma unroll
    for (int k = 0; k < PACK; ++k) {
        cs[k] = __ldg(cp + k);
        ss[k] = __ldg(sp + k);
    }
#pragma unroll
    for (int p = 0; p < PACK / 2; ++p) {
        const float2 av = __bfloat1622float2(a.pair[p]);
        const float2 bv = __bfloat1622float2(b.pair[p]);
        float r0, r1, q0, q1;
        rotate(av.x, bv.x, cs[2 * p], ss[2 * p], r0, q0);
        rotate(av.y, bv.y, cs[2 * p + 1], ss[2 * p + 1], r1, q1);
        ra.pair[p] = __floats2bfloat162_rn(r0, r1);
        rb.pair[p] = __floats2bfloat162_rn(q0, q1);
    }
    *reinterpret_cast<uint4*>(y1p) = ra.raw;
    *reinterpret_cast<uint4*>(y2p) = rb.raw;
}

// The packs (vector path) or pairs (scalar path) from `first` on, `stride` apart. Index is 32-bit when
// every element index fits: 64-bit division is a long instruction sequence, and there are three per pack.
template <typename Index>
__device__ __forceinline__ void rotate_all(const __nv_bfloat16* __restrict__ x, const float* __restrict__ cos_t,
                                           const float* __restrict__ sin_t, __nv_bfloat16* __restrict__ y,
                                           Index rows, Index s, Index h, Index d, Index first, Index stride)
{
    const Index half = d / 2;
    if (half % PACK == 0) {
        // Vector path: item = (row, pack of 8 frequencies).
        const Index packs = half / PACK;
        const Index items = rows * packs;
        for (Index base = first; base < items; base += stride * UNROLL) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const Index item = base + u * stride;
                if (item < items) {
                    const Index row = item / packs;
                    const Index f = (item - row * packs) * PACK;
                    const Index token = (row / h) % s;
                    const Index at = row * d + f;
                    rotate_pack(x + at, x + at + half, cos_t + token * half + f, sin_t + token * half + f,
                                y + at, y + at + half);
                }
            }
        }
    } else {
        // Scalar path: item = (row, one frequency).
        const Index items = rows * half;
        for (Index item = first; item < items; item += stride) {
            const Index row = item / half;
            const Index f = item - row * half;
            const Index token = (row / h) % s;
            const Index at = row * d + f;
            float r1, r2;
            rotate(__bfloat162float(x[at]), __bfloat162float(x[at + half]), __ldg(cos_t + token * half + f),
                   __ldg(sin_t + token * half + f), r1, r2);
            y[at] = __float2bfloat16(r1);
            y[at + half] = __float2bfloat16(r2);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
rope_pack8(const __nv_bfloat16* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
           __nv_bfloat16* __restrict__ y, int b, int s, int h, int d)
{
    const size_t rows = static_cast<size_t>(b) * s * h;
    const size_t stride = static_cast<size_t>(gridDim.x) * THREADS;
    const size_t first = static_cast<size_t>(blockIdx.x) * THREADS + threadIdx.x;
    // 32-bit indices when the element count, plus one grid stride of overshoot, stays below 2^32.
    if (rows * d + stride * UNROLL < (size_t(1) << 32))
        rotate_all<unsigned>(x, cos_t, sin_t, y, unsigned(rows), unsigned(s), unsigned(h), unsigned(d), unsigned(first),
                             unsigned(stride));
    else
        rotate_all<size_t>(x, cos_t, sin_t, y, rows, size_t(s), size_t(h), size_t(d), first, stride);
}
