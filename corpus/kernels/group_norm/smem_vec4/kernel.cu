// Group norm, tuned for a memory-bound GPU: one block per (sample, group), the group read from DRAM
// once and kept in shared memory for the variance and write passes, float4 loads and stores, and
// warp-shuffle block sums.
//
// A group is a contiguous run of len = (c / groups) * hw floats. Its first cache_len floats (up to
// CACHE_FLOATS, 64 KiB) are staged in dynamic shared memory as they are read; a longer group re-reads
// the rest from global memory in the later passes (few such groups fit on the GPU at once, so the
// re-read mostly hits L2). float4 needs hw % 4 == 0 (a vector never spans two channels, and every
// group starts 16-byte aligned); other shapes take the scalar (V = 1) instantiation of the same code.
//
// Numerics: sums are of x - pivot (the group's first element), and deviations are (x - pivot) - d
// with d = mean - pivot, so a group far from zero keeps its digits (x - pivot is exact there).

#include <cstdint>

constexpr int THREADS = 512;           // threads per block (one group per block)
constexpr int WARPS = THREADS / 32;
constexpr int CACHE_FLOATS = 16384;    // floats of a group kept in shared memory (64 KiB)
constexpr int UNROLL = 4;              // independent vector loads in flight per thread
constexpr int MIN_BLOCKS_PER_SM = 3;   // three 64 KiB blocks share an SM's 227 KiB
constexpr float EPS = 1e-5f;
constexpr unsigned FULL_MASK = 0xffffffffu;

template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; };
template <> struct VecOf<4> { using type = float4; };

__device__ __forceinline__ float shifted_sum(float v, float p) { return v - p; }
__device__ __forceinline__ float shifted_sum(float4 v, float p) { return ((v.x - p) + (v.y - p)) + ((v.z - p) + (v.w - p)); }

__device__ __forceinline__ float dev(float v, float p, float d) { return (v - p) - d; }
__device__ __forceinline__ float sq_dev(float v, float p, float d) { const float u = dev(v, p, d); return u * u; }
__device__ __forceinline__ float sq_dev(float4 v, float p, float d)
{
    return (sq_dev(v.x, p, d) + sq_dev(v.y, p, d)) + (sq_dev(v.z, p, d) + sq_dev(v.w, p, d));
}

// y = (x - mean) * rstd * w + b, with the per-channel scale = rstd * w folded once.
__device__ __forceinline__ float affine(float v, float p, float d, float scale, float shift)
{
    return fmaf(dev(v, p, d), scale, shift);
}
__device__ __forceinline__ float4 affine(float4 v, float p, float d, float scale, float shift)
{
    return make_float4(affine(v.x, p, d, scale, shift), affine(v.y, p, d, scale, shift),
                       affine(v.z, p, d, scale, shift), affine(v.w, p, d, scale, shift));
}

// Block-wide sum: shuffles within each warp, one shared-memory exchange between warps. Every thread
// adds the warp partials in the same order, so all get identical bits. Ends on a barrier: red is free.
__device__ __forceinline__ float block_sum(float v, float* __restrict__ red)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) total += red[w];
    __syncthreads();
    return total;
}

template <int V>
__device__ __forceinline__ void norm_group(const float* __restrict__ xg, float* __restrict__ yg,
                                           const float* __restrict__ weight, const float* __restrict__ bias,
                                           int c0, int hw, int len, int cache_len, float* __restrict__ cache,
                                           float* __restrict__ red)
{
    using Vec = typename VecOf<V>::type;
    const Vec* __restrict__ xv = reinterpret_cast<const Vec*>(xg);
    Vec* __restrict__ yv = reinterpret_cast<Vec*>(yg);
    Vec* __restrict__ cv = reinterpret_cast<Vec*>(cache);
    const int n = len / V;             // exact: V == 4 only when hw % 4 == 0
    const int cached = cache_len / V;  // cache_len is len or CACHE_FLOATS: a multiple of V
    const int tid = threadIdx.x;
    const float pivot = __ldg(xg);

    // Pass 1: read the group once, staging the cached part in shared memory; the shifted sum.
    float s = 0.0f;
    for (int base = 0; base < cached; base += THREADS * UNROLL) {
        Vec v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = base + u * THREADS + tid;
            if (j < cached) v[u] = __ldg(xv + j);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = base + u * THREADS + tid;
            if (j < cached) {
                cv[j] = v[u];  // each thread re-reads only what it wrote itself: no barrier needed
                s += shifted_sum(v[u], pivot);
            }
        }
    }
    for (int j = cached + tid; j < n; j += THREADS) s += shifted_sum(__ldg(xv + j), pivot);
    const float d = block_sum(s, red) / static_cast<float>(len);  // mean - pivot

    // Pass 2: the squared deviations, from shared memory (and the uncached rest from global).
    float q = 0.0f;
    for (int j = tid; j < cached; j += THREADS) q += sq_dev(cv[j], pivot, d);
    for (int j = cached + tid; j < n; j += THREADS) q += sq_dev(__ldg(xv + j), pivot, d);
    const float rstd = 1.0f / sqrtf(block_sum(q, red) / static_cast<float>(len) + EPS);

    // Pass 3: normalise, scale and shift per channel, write. A vector lies in one channel (hw % V == 0).
    for (int j = tid; j < cached; j += THREADS) {
        const int ch = c0 + (j * V) / hw;
        yv[j] = affine(cv[j], pivot, d, rstd * __ldg(weight + ch), __ldg(bias + ch));
    }
    for (int j = cached + tid; j < n; j += THREADS) {
        const int ch = c0 + (j * V) / hw;
        yv[j] = affine(__ldg(xv + j), pivot, d, rstd * __ldg(weight + ch), __ldg(bias + ch));
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS_PER_SM)
group_norm_smem_vec4(const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
                     float* __restrict__ y, int n, int c, int hw, int groups, int cache_len)
{
    extern __shared__ float4 cache_raw[];  // cache_len floats, 16-byte aligned
    __shared__ float red[WARPS];

    const int per_group = c / groups;
    const int len = per_group * hw;
    const int c0 = (blockIdx.x % groups) * per_group;
    const float* xg = x + static_cast<size_t>(blockIdx.x) * len;  // 64-bit offsets
    float* yg = y + static_cast<size_t>(blockIdx.x) * len;
    float* cache = reinterpret_cast<float*>(cache_raw);

    // Block-uniform choice, so the barriers inside either instantiation are reached by every thread.
    const bool aligned = (hw % 4 == 0) &&
                         ((reinterpret_cast<uintptr_t>(xg) | reinterpret_cast<uintptr_t>(yg)) & 15u) == 0;
    if (aligned)
        norm_group<4>(xg, yg, weight, bias, c0, hw, len, cache_len, cache, red);
    else
        norm_group<1>(xg, yg, weight, bias, c0, hw, len, cache_len, cache, red);
}
