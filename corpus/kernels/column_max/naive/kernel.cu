// Column maximum, the plain way: one thread per column, walking every row in order. Consecutive
// threads read consecutive columns (coalesced), but only `cols` threads exist, each with a long
// dependent loop. A strict > keeps the first row on ties.

#include <cstdint>

constexpr int THREADS = 128;

extern "C" __global__ void __launch_bounds__(THREADS)
column_max_naive(const float* x, float* values, int64_t* indices, int rows, int cols)
{
    const int col = blockIdx.x * THREADS + threadIdx.x;
    if (col >= cols) return;
    float best = x[col];
    int where = 0;
    for (int r = 1; r < rows; ++r) {
        const float v = x[static_cast<size_t>(r) * cols + col];
        if (v > best) {
            best = v;
            where = r;
        }
    }
    values[col] = best;
    indices[col] = where;
}
