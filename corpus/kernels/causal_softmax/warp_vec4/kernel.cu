// Scaled causal softmax, tuned for a memory-bound GPU: one block per row, only the visible keys
// read (once: they stay in registers between the reductions and the write), masked keys written as
// zeros without a read, float4 loads and stores where the row allows them, warp-shuffle reductions.
//
// Layout: thread t owns vectors t, t + THREADS, ... of its row, so every warp-wide access is
// contiguous. The first CACHE_FLOATS floats a thread owns stay in registers; a row with more visible
// keys than THREADS * CACHE_FLOATS re-reads the rest in the later passes. A vector that straddles the
// last visible key is read whole (it lies inside the row) and its hidden lanes masked.
//
// float4 needs sk % 4 == 0 (every row then starts 16-byte aligned); other widths take the scalar
// (V = 1) instantiation. exp(scale * (x - max)) is exp2(x * c - max * c) with c = scale * log2(e).

#include <cstdint>

constexpr int THREADS = 128;           // threads per block (one row per block)
constexpr int WARPS = THREADS / 32;
constexpr int CACHE_FLOATS = 16;       // floats per thread kept in registers across the passes
constexpr int MIN_BLOCKS_PER_SM = 8;   // occupancy target for __launch_bounds__ (<= 64 registers)
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL_MASK = 0xffffffffu;

template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; };
template <> struct VecOf<4> { using type = float4; };

__device__ __forceinline__ float lane(float v, int) { return v; }
__device__ __forceinline__ float lane(float4 v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// The maximum of the visible elements of a vector whose first element is key `first`.
template <int V, typename Vec>
__device__ __forceinline__ float masked_max(Vec v, int first, int visible)
{
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < V; ++k)
        if (first + k < visible) m = fmaxf(m, lane(v, k));
    return m;
}

// exp(scale * (x - max)) of one element, 0 when hidden; mc = max * c rounded once.
__device__ __forceinline__ float prob(float v, bool seen, float c, float mc) { return seen ? exp2f(fmaf(v, c, -mc)) : 0.0f; }

template <int V, typename Vec>
__device__ __forceinline__ float masked_exp_sum(Vec v, int first, int visible, float c, float mc)
{
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) s += prob(lane(v, k), first + k < visible, c, mc);
    return s;
}

__device__ __forceinline__ float normalised(float v, int first, int visible, float c, float mc, float inv)
{
    return prob(v, first < visible, c, mc) * inv;
}
__device__ __forceinline__ float4 normalised(float4 v, int first, int visible, float c, float mc, float inv)
{
    return make_float4(prob(v.x, first < visible, c, mc) * inv, prob(v.y, first + 1 < visible, c, mc) * inv,
                       prob(v.z, first + 2 < visible, c, mc) * inv, prob(v.w, first + 3 < visible, c, mc) * inv);
}

template <typename Vec> __device__ __forceinline__ Vec zero();
template <> __device__ __forceinline__ float zero<float>() { return 0.0f; }
template <> __device__ __forceinline__ float4 zero<float4>() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// Block-wide reductions: shuffles in the warp, one shared-memory exchange; all threads get the same
// bits (same order everywhere). Each ends on a barrier, so red is free for the next one.
__device__ __forceinline__ float block_max(float v, float* __restrict__ red)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float m = red[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    return m;
}

__device__ __forceinline__ float block_sum(float v, float* __restrict__ red)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float s = red[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) s += red[w];
    __syncthreads();
    return s;
}

template <int V>
__device__ __forceinline__ void softmax_row(const float* __restrict__ xr, float* __restrict__ yr, int sk, int visible,
                                            float c, float* __restrict__ red)
{
    using Vec = typename VecOf<V>::type;
    constexpr int CACHED = CACHE_FLOATS / V;  // vectors per thread held in registers
    const Vec* __restrict__ xv = reinterpret_cast<const Vec*>(xr);
    Vec* __restrict__ yv = reinterpret_cast<Vec*>(yr);
    const int n = sk / V;                       // vectors in the row (exact: V == 4 only when sk % 4 == 0)
    const int nv = (visible + V - 1) / V;       // vectors holding a visible key
    const int tid = threadIdx.x;

    // Pass 1: the visible keys, read once into registers (the rest of a long row streamed); the max.
    Vec cache[CACHED];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < CACHED; ++i) {
        const int j = i * THREADS + tid;
        if (j < nv) {
            cache[i] = __ldg(xv + j);
            m = fmaxf(m, masked_max<V>(cache[i], j * V, visible));
        }
    }
    for (int j = CACHED * THREADS + tid; j < nv; j += THREADS) m = fmaxf(m, masked_max<V>(__ldg(xv + j), j * V, visible));
    const float mc = __fmul_rn(block_max(m, red), c);  // the row max in scaled log2 units, rounded once

    // Pass 2: the sum of the probabilities.
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < CACHED; ++i) {
        const int j = i * THREADS + tid;
        if (j < nv) s += masked_exp_sum<V>(cache[i], j * V, visible, c, mc);
    }
    for (int j = CACHED * THREADS + tid; j < nv; j += THREADS) s += masked_exp_sum<V>(__ldg(xv + j), j * V, visible, c, mc);
    const float inv = 1.0f / block_sum(s, red);  // >= 1: the max element contributes exp(0)

    // Pass 3: write the visible part normalised, the hidden part as zeros (never read).
#pragma unroll
    for (int i = 0; i < CACHED; ++i) {
        const int j = i * THREADS + tid;
        if (j < nv) yv[j] = normalised(cache[i], j * V, visible, c, mc, inv);
    }
    for (int j = CACHED * THREADS + tid; j < nv; j += THREADS) yv[j] = normalised(__ldg(xv + j), j * V, visible, c, mc, inv);
    for (int j = nv + tid; j < n; j += THREADS) yv[j] = zero<Vec>();
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS_PER_SM)
causal_softmax_warp_vec4(const float* __restrict__ x, float* __restrict__ y, int bh, int sq, int sk, float scale)
{
    __shared__ float red[WARPS];
    const int query = blockIdx.x % sq;
    const int visible = min(sk, query + 1 + (sk - sq));  // keys 0 .. visible - 1
    const float* xr = x + static_cast<size_t>(blockIdx.x) * sk;  // 64-bit offsets
    float* yr = y + static_cast<size_t>(blockIdx.x) * sk;
    const float c = scale * LOG2E;

    // Block-uniform choice, so the barriers inside either instantiation are reached by every thread.
    const bool aligned = (sk % 4 == 0) &&
                         ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr)) & 15u) == 0;
    if (aligned)
        softmax_row<4>(xr, yr, sk, visible, c, red);
    else
        softmax_row<1>(xr, yr, sk, visible, c, red);
}
