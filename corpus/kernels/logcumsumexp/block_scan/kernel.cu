// Log-cumulative-sum-exp, tuned for a memory-bound GPU: one block per row, the row scanned in tiles
// of TILE = THREADS * ITEMS elements. Within a tile each thread loads ITEMS consecutive elements (two
// float4 loads), scans them in registers, the thread totals are scanned across the warp with shuffles,
// the warp totals exchanged through shared memory, and a carry (the log-sum-exp of every earlier tile)
// joins each tile to the ones before. x is read once and y written once.
//
// float4 needs cols % 4 == 0 (every row then starts 16-byte aligned); other widths, and the last
// partial vectors of a row, take scalar loads of the same layout. Missing elements are -inf, the
// identity of log-add-exp. The combine uses the fast exp and log intrinsics: their error (a few
// 1e-7 absolute) is far inside the tolerance, and it keeps the scan memory-bound.

#include <cstdint>

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int ITEMS = 8;                      // consecutive elements per thread per tile
constexpr int TILE = THREADS * ITEMS;         // 2048 elements
constexpr int MIN_BLOCKS_PER_SM = 4;
constexpr unsigned FULL_MASK = 0xffffffffu;

// a (+) b = log(exp(a) + exp(b)); -inf is the identity, and (-inf) (+) (-inf) stays -inf.
__device__ __forceinline__ float lse(float a, float b)
{
    const float m = fmaxf(a, b);
    if (m == -INFINITY) return m;
    return m + __logf(1.0f + __expf(-fabsf(a - b)));
}

template <bool VEC>
__device__ __forceinline__ void load_items(const float* __restrict__ xr, int first, int cols, float (&v)[ITEMS])
{
    if (VEC && first + ITEMS <= cols) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(xr + first));
        const float4 b = __ldg(reinterpret_cast<const float4*>(xr + first) + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) v[k] = first + k < cols ? __ldg(xr + first + k) : -INFINITY;
    }
}

template <bool VEC>
__device__ __forceinline__ void store_items(float* __restrict__ yr, int first, int cols, const float (&v)[ITEMS])
{
    if (VEC && first + ITEMS <= cols) {
        reinterpret_cast<float4*>(yr + first)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(yr + first)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k)
            if (first + k < cols) yr[first + k] = v[k];
    }
}

template <bool VEC>
__device__ __forceinline__ void scan_row(const float* __restrict__ xr, float* __restrict__ yr, int cols,
                                         float* __restrict__ warp_total)
{
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid / 32;
    float carry = -INFINITY;  // log-sum-exp of every element of the earlier tiles
    for (int base = 0; base < cols; base += TILE) {
        const int first = base + tid * ITEMS;
        float v[ITEMS];
        load_items<VEC>(xr, first, cols, v);

        // The thread's own inclusive scan, in registers.
#pragma unroll
        for (int k = 1; k < ITEMS; ++k) v[k] = lse(v[k - 1], v[k]);

        // Inclusive scan of the thread totals across the warp (Hillis-Steele with shuffles).
        float t = v[ITEMS - 1];
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
            const float other = __shfl_up_sync(FULL_MASK, t, offset);
            if (lane >= offset) t = lse(other, t);
        }
        if (lane == 31) warp_total[warp] = t;
        __syncthreads();

        // Everything before this thread: the carry, the earlier warps, the earlier lanes of this warp.
        float before = carry;
        for (int w = 0; w < warp; ++w) before = lse(before, warp_total[w]);
        const float lanes_before = __shfl_up_sync(FULL_MASK, t, 1);
        if (lane > 0) before = lse(before, lanes_before);
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) v[k] = lse(before, v[k]);
        store_items<VEC>(yr, first, cols, v);

        // The next tile's carry: every thread folds the warp totals in the same order (same bits).
#pragma unroll
        for (int w = 0; w < WARPS; ++w) carry = lse(carry, warp_total[w]);
        __syncthreads();  // warp_total is rewritten by the next tile
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS_PER_SM)
logcumsumexp_block_scan(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float warp_total[WARPS];
    const float* xr = x + static_cast<size_t>(blockIdx.x) * cols;  // 64-bit offsets
    float* yr = y + static_cast<size_t>(blockIdx.x) * cols;
    // Block-uniform choice, so the barriers inside either instantiation are reached by every thread.
    const bool aligned = (cols % 4 == 0) &&
                         ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr)) & 15u) == 0;
    if (aligned)
        scan_row<true>(xr, yr, cols, warp_total);
    else
        scan_row<false>(xr, yr, cols, warp_total);
}
