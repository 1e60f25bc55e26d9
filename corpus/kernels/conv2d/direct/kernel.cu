// Conv2d fp16 NHWC x KRSC -> NHWC, the direct way: one thread per output element, fp32 accumulation.
//
// The baseline every other conv2d kernel is measured against and the one that covers every case:
// no tiles, no shared memory, no tensor cores, no alignment assumptions (any C, F, stride, pad,
// filter size). Block (row, j) covers output row row = n*P + p, elements j*THREADS.. of its Q*F
// values (q major, f minor): a warp's threads are consecutive filters of one output pixel, so their
// y stores are contiguous and they read the same input pixel (a broadcast) against different
// filters (strided by R*S*C, served from L1/L2). Taps outside the image are skipped: that is the
// zero padding. Index arithmetic is 32-bit (no 64-bit division, which would be a call); memory
// offsets are 64-bit.

#include <cuda_fp16.h>
#include <cstdint>

constexpr int THREADS = 256;        // threads per block
constexpr int MIN_BLOCKS_PER_SM = 4;  // 1024 threads resident per SM: at most 64 registers each

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS_PER_SM)
conv2d_direct(const __half* __restrict__ x, const __half* __restrict__ w, __half* __restrict__ y,
              int N, int H, int W, int C, int F, int R, int S, int P, int Q, int stride, int pad)
{
    const int row = blockIdx.x;  // n * P + p
    const int j = blockIdx.y * THREADS + threadIdx.x;  // q * F + f
    if (j >= Q * F) return;

    // Output coordinates of this thread's element.
    const int n = row / P;
    const int p = row - n * P;
    const int q = j / F;
    const int f = j - q * F;

    float acc = 0.0f;
    for (int r = 0; r < R; ++r) {
        const int ih = p * stride - pad + r;
        if (ih < 0 || ih >= H) continue;  // zero padding: the tap contributes nothing
        for (int s = 0; s < S; ++s) {
            const int iw = q * stride - pad + s;
            if (iw < 0 || iw >= W) continue;
            const __half* xp = x + ((static_cast<int64_t>(n) * H + ih) * W + iw) * C;
            const __half* wp = w + ((static_cast<int64_t>(f) * R + r) * S + s) * C;
            for (int c = 0; c < C; ++c) acc = fmaf(__half2float(xp[c]), __half2float(wp[c]), acc);
        }
    }
    y[static_cast<int64_t>(row) * Q * F + j] = __float2half_rn(acc);
}
