// Row softmax, tuned for a memory-bound GPU: one block per row, the row read from global memory
// once (held in registers between the reduction and the write), float4 loads and stores where the
// row allows them, warp-shuffle reductions, and an online (max, sum) pair so that one block-wide
// reduction yields both statistics.
//
// Layout: thread t of a block owns vectors t, t + THREADS, t + 2*THREADS, ... of its row, so every
// warp-wide load is contiguous (coalesced). The first CACHE_FLOATS floats a thread owns stay in
// registers; a row longer than THREADS * CACHE_FLOATS (4096 here) streams the rest and re-reads it
// in the write pass (a long row is one of few, so that re-read hits L2).
//
// Every shape is supported: float4 needs 16-byte aligned row starts, which holds for every row
// exactly when cols % 4 == 0 (the buffers themselves are 256-byte aligned); other widths, or
// pointers that are not aligned alike, take the scalar (V = 1) instantiation of the same code.
//
// Numerics: exp(v - m) is computed as exp2(v * log2(e) - m2) with m2 = m * log2(e) rounded once
// (__fmul_rn, never fused), and the fma keeps v * log2(e) exact. Partial sums are rescaled by
// exp2(m2_old - m2_new) using the same rounded m2 values, so the rounding of m2 is a common
// factor of every term and cancels in the normalisation, even for rows near +-1000.

#include <cstdint>

constexpr int THREADS = 256;           // threads per block (one row per block)
constexpr int WARPS = THREADS / 32;
constexpr int CACHE_FLOATS = 16;       // floats per thread kept in registers across the passes
constexpr int MIN_BLOCKS_PER_SM = 4;   // occupancy target for __launch_bounds__ (<= 64 registers)
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;

template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; };
template <> struct VecOf<4> { using type = float4; };

// The row maximum in log2 units. Always rounded the same way, so equal inputs give equal bits.
__device__ __forceinline__ float scaled(float m) { return __fmul_rn(m, LOG2E); }

// exp(v - m) given m2 = scaled(m).
__device__ __forceinline__ float exp_shifted(float v, float m2) { return exp2f(fmaf(v, LOG2E, -m2)); }

__device__ __forceinline__ float vec_max(float v) { return v; }
__device__ __forceinline__ float vec_max(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }

__device__ __forceinline__ float vec_exp_sum(float v, float m2) { return exp_shifted(v, m2); }
__device__ __forceinline__ float vec_exp_sum(float4 v, float m2)
{
    return (exp_shifted(v.x, m2) + exp_shifted(v.y, m2)) + (exp_shifted(v.z, m2) + exp_shifted(v.w, m2));
}

__device__ __forceinline__ float vec_normalise(float v, float m2, float inv) { return exp_shifted(v, m2) * inv; }
__device__ __forceinline__ float4 vec_normalise(float4 v, float m2, float inv)
{
    return make_float4(exp_shifted(v.x, m2) * inv, exp_shifted(v.y, m2) * inv,
                       exp_shifted(v.z, m2) * inv, exp_shifted(v.w, m2) * inv);
}

// Combine two partial results (m, s), where s = sum of exp(x - m) over the elements seen.
// An empty partial is (-inf, 0); two empty partials stay empty (and -inf - -inf, a NaN, is avoided).
__device__ __forceinline__ void merge(float& m, float& s, float m_other, float s_other)
{
    const float m_new = fmaxf(m, m_other);
    if (m_new == -INFINITY) return;
    const float m2_new = scaled(m_new);
    s = s * exp2f(scaled(m) - m2_new) + s_other * exp2f(scaled(m_other) - m2_new);
    m = m_new;
}

template <int V>
__device__ __forceinline__ void softmax_row(const float* __restrict__ xr, float* __restrict__ yr, int cols,
                                            float* __restrict__ red_m, float* __restrict__ red_s)
{
    using Vec = typename VecOf<V>::type;
    constexpr int CACHED = CACHE_FLOATS / V;  // vectors per thread held in registers
    const Vec* __restrict__ xv = reinterpret_cast<const Vec*>(xr);
    Vec* __restrict__ yv = reinterpret_cast<Vec*>(yr);
    const int n = cols / V;  // exact: V == 4 only when cols % 4 == 0
    const int tid = threadIdx.x;

    // Pass 1a: load the cached part of the row; its max, then its sum, exactly (no rescaling).
    Vec cache[CACHED];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < CACHED; ++i) {
        const int j = i * THREADS + tid;
        if (j < n) {
            cache[i] = __ldg(xv + j);
            m = fmaxf(m, vec_max(cache[i]));
        }
    }
    float s = 0.0f;
    {
        const float m2 = scaled(m);
#pragma unroll
        for (int i = 0; i < CACHED; ++i) {
            const int j = i * THREADS + tid;
            if (j < n) s += vec_exp_sum(cache[i], m2);
        }
    }

    // Pass 1b: the rest of a long row, streamed with the online update (rescale when the max grows).
    for (int j = CACHED * THREADS + tid; j < n; j += THREADS) {
        const Vec v = __ldg(xv + j);
        const float vm = vec_max(v);
        if (vm > m) {
            s *= exp2f(scaled(m) - scaled(vm));  // m == -inf only with s == 0: 0 * 0
            m = vm;
        }
        s += vec_exp_sum(v, scaled(m));
    }

    // Reduce (m, s) across the warp with shuffles, then across warps through shared memory.
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float m_other = __shfl_xor_sync(FULL_MASK, m, offset);
        const float s_other = __shfl_xor_sync(FULL_MASK, s, offset);
        merge(m, s, m_other, s_other);
    }
    if ((tid & 31) == 0) {
        red_m[tid / 32] = m;
        red_s[tid / 32] = s;
    }
    __syncthreads();
    // Every thread merges the per-warp partials in the same order, so all hold identical bits.
    // The shared arrays are not written again in this launch: no second barrier is needed.
    m = red_m[0];
    s = red_s[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) merge(m, s, red_m[w], red_s[w]);

    // Pass 2: normalise and write; the cached part from registers, the rest re-read.
    const float inv_sum = 1.0f / s;  // s >= 1: the max element contributes exp(0)
    const float m2 = scaled(m);
#pragma unroll
    for (int i = 0; i < CACHED; ++i) {
        const int j = i * THREADS + tid;
        if (j < n) yv[j] = vec_normalise(cache[i], m2, inv_sum);
    }
    for (int j = CACHED * THREADS + tid; j < n; j += THREADS) yv[j] = vec_normalise(__ldg(xv + j), m2, inv_sum);
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS_PER_SM)
row_softmax_warp_vec4(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float red_m[WARPS];
    __shared__ float red_s[WARPS];

    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform per block, before any barrier
    const float* xr = x + static_cast<size_t>(row) * cols;  // 64-bit offsets
    float* yr = y + static_cast<size_t>(row) * cols;

    // Block-uniform choice, so the barrier inside either instantiation is reached by every thread.
    const bool aligned = (cols % 4 == 0) &&
                         ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr)) & 15u) == 0;
    if (aligned)
        softmax_row<4>(xr, yr, cols, red_m, red_s);
    else
        softmax_row<1>(xr, yr, cols, red_m, red_s);
}
