// GEMM y = x @ W.T in bf16, the plain way: one thread per output element, fp32 accumulation.
//
// Thread (tx, ty) of block (bx, by) computes y[m, n] with n = bx * TILE_N + tx and
// m = by * TILE_M + ty: a scalar loop over K reading x[m, k] (the same address for a row of
// threads: a broadcast) and W[n, k] (one row of W per thread, so a warp reads TILE_N different
// rows: uncoalesced, served from L1/L2 at best). No shared memory, no tensor cores, no vectors.
// The sum runs in fp32 in increasing k, then one rounding to bf16 (nearest even).
//
// Every shape is supported: scalar 2-byte loads need no alignment, and threads past M or N exit.

#include <cuda_bf16.h>

constexpr int TILE_N = 16;  // threads per block along N (x)
constexpr int TILE_M = 16;  // threads per block along M (y)

extern "C" __global__ void __launch_bounds__(TILE_N * TILE_M)
gemm_bf16_naive(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                __nv_bfloat16* __restrict__ y, int M, int N, int K)
{
    const int n = blockIdx.x * TILE_N + threadIdx.x;
    const int m = blockIdx.y * TILE_M + threadIdx.y;
    if (m >= M || n >= N) return;
    // 64-bit offsets: M * K and N * K exceed what 32 bits hold for large problems.
    const __nv_bfloat16* xr = x + static_cast<long long>(m) * K;
    const __nv_bfloat16* wr = w + static_cast<long long>(n) * K;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__bfloat162float(xr[k]), __bfloat162float(wr[k]), acc);
    y[static_cast<long long>(m) * N + n] = __float2bfloat16_rn(acc);
}
