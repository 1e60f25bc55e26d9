// Column maximum, tuned for a memory-bound GPU: the rows are split into chunks of ROWS_PER_SPLIT and
// each (column block, chunk) pair is one block, so a wide or a tall matrix both fill the GPU; each
// thread owns four adjacent columns (one float4 per row) and keeps UNROLL rows of loads in flight.
// A second launch merges the chunks' answers per column, in chunk order.
//
// Ties go to the first row: within a chunk rows are visited in order with a strict >, and the merge
// visits chunks in order with a strict >. float4 needs cols % 4 == 0 (every row then starts 16-byte
// aligned); other widths take the scalar path, one column per thread.

#include <cstdint>

constexpr int THREADS = 128;
constexpr int ROWS_PER_SPLIT = 128;   // rows one block reduces; the chunks are merged by column_max_merge
constexpr int UNROLL = 8;             // row loads in flight per thread
constexpr int MERGE_THREADS = 256;

template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; using index = int; };
template <> struct VecOf<4> { using type = float4; using index = int4; };

__device__ __forceinline__ int splat(int r, int) { return r; }
__device__ __forceinline__ int4 splat(int r, int4) { return make_int4(r, r, r, r); }

__device__ __forceinline__ void take(float v, int r, float& best, int& at)
{
    if (v > best) { best = v; at = r; }
}

__device__ __forceinline__ void take(const float4& v, int r, float4& best, int4& at)
{
    take(v.x, r, best.x, at.x);
    take(v.y, r, best.y, at.y);
    take(v.z, r, best.z, at.z);
    take(v.w, r, best.w, at.w);
}

// The best (value, row) of column vector t (V adjacent columns) over rows r0 .. r1 - 1, in row order.
template <int V>
__device__ __forceinline__ void reduce_chunk(const float* __restrict__ x, float* __restrict__ part_v,
                                             int* __restrict__ part_i, int t, int r0, int r1, int cols, size_t out)
{
    using Vec = typename VecOf<V>::type;
    using Index = typename VecOf<V>::index;
    const int n = cols / V;  // column vectors per row (exact: V == 4 only when cols % 4 == 0)
    if (t >= n) return;
    const Vec* __restrict__ xv = reinterpret_cast<const Vec*>(x) + t;
    Vec best = __ldg(xv + static_cast<size_t>(r0) * n);
    Index at = splat(r0, Index());
    int r = r0 + 1;
    for (; r + UNROLL <= r1; r += UNROLL) {
        Vec v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = __ldg(xv + static_cast<size_t>(r + u) * n);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) take(v[u], r + u, best, at);
    }
    for (; r < r1; ++r) take(__ldg(xv + static_cast<size_t>(r) * n), r, best, at);
    reinterpret_cast<Vec*>(part_v + out)[t] = best;
    reinterpret_cast<Index*>(part_i + out)[t] = at;
}

// Launch 1: the best (value, row) of every column over one chunk of rows, into the scratch partials.
extern "C" __global__ void __launch_bounds__(THREADS)
column_max_split(const float* __restrict__ x, float* __restrict__ part_v, int* __restrict__ part_i, int rows, int cols)
{
    const int r0 = blockIdx.y * ROWS_PER_SPLIT;
    const int r1 = min(rows, r0 + ROWS_PER_SPLIT);
    const int t = blockIdx.x * THREADS + threadIdx.x;
    const size_t out = static_cast<size_t>(blockIdx.y) * cols;
    if (cols % 4 == 0)  // thread t owns columns 4t .. 4t + 3
        reduce_chunk<4>(x, part_v, part_i, t, r0, r1, cols, out);
    else                // thread t owns column t
        reduce_chunk<1>(x, part_v, part_i, t, r0, r1, cols, out);
}

// Launch 2: merge the chunks of each column in order (strict >: the earlier chunk wins a tie).
extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
column_max_merge(const float* __restrict__ part_v, const int* __restrict__ part_i, float* __restrict__ values,
                 int64_t* __restrict__ indices, int chunks, int cols)
{
    const int col = blockIdx.x * MERGE_THREADS + threadIdx.x;
    if (col >= cols) return;
    float best = part_v[col];
    int at = part_i[col];
    for (int k = 1; k < chunks; ++k) take(part_v[static_cast<size_t>(k) * cols + col], part_i[static_cast<size_t>(k) * cols + col], best, at);
    values[col] = best;
    indices[col] = at;
}
