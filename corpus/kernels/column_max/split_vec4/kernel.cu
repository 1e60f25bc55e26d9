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

struct Best4 {                        // the running answer of four adjacent columns
    float4 v;
    int4 at;
};

__device__ __forceinline__ void take(float v, int r, float& best, int& at)
{
    if (v > best) { best = v; at = r; }
}

__device__ __forceinline__ void take(const float4& v, int r, Best4& b)
{
    take(v.x, r, b.v.x, b.at.x);
    take(v.y, r, b.v.y, b.at.y);
    take(v.z, r, b.v.z, b.at.z);
    take(v.w, r, b.v.w, b.at.w);
}

// Launch 1: the best (value, row) of every column over one chunk of rows, into the scratch partials.
extern "C" __global__ void __launch_bounds__(THREADS)
column_max_split(const float* __restrict__ x, float* __restrict__ part_v, int* __restrict__ part_i, int rows, int cols)
{
    const int chunk = blockIdx.y;
    const int r0 = chunk * ROWS_PER_SPLIT;
    const int r1 = min(rows, r0 + ROWS_PER_SPLIT);
    const int t = blockIdx.x * THREADS + threadIdx.x;
    const size_t out = static_cast<size_t>(chunk) * cols;

    if (cols % 4 == 0) {  // vector path: thread t owns columns 4t .. 4t + 3
        const int vcols = cols / 4;
        if (t >= vcols) return;
        const float4* __restrict__ xv = reinterpret_cast<const float4*>(x) + t;
        Best4 b;
        b.v = __ldg(xv + static_cast<size_t>(r0) * vcols);
        b.at = make_int4(r0, r0, r0, r0);
        int r = r0 + 1;
        for (; r + UNROLL <= r1; r += UNROLL) {
            float4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = __ldg(xv + static_cast<size_t>(r + u) * vcols);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) take(v[u], r + u, b);
        }
        for (; r < r1; ++r) take(__ldg(xv + static_cast<size_t>(r) * vcols), r, b);
        reinterpret_cast<float4*>(part_v + out)[t] = b.v;
        reinterpret_cast<int4*>(part_i + out)[t] = b.at;
    } else {  // scalar path: thread t owns column t
        if (t >= cols) return;
        const float* __restrict__ xc = x + t;
        float best = __ldg(xc + static_cast<size_t>(r0) * cols);
        int at = r0;
        int r = r0 + 1;
        for (; r + UNROLL <= r1; r += UNROLL) {
            float v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = __ldg(xc + static_cast<size_t>(r + u) * cols);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) take(v[u], r + u, best, at);
        }
        for (; r < r1; ++r) take(__ldg(xc + static_cast<size_t>(r) * cols), r, best, at);
        part_v[out + t] = best;
        part_i[out + t] = at;
    }
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
