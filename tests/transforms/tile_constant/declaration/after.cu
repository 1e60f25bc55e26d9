// Row copy: each block copies ROWS_PER_BLOCK rows, its THREADS threads striding along the columns.
constexpr int ROWS_PER_BLOCK = 4;  // rows per block (the plan's grid divides by it)
constexpr int THREADS = 128;
static_assert(THREADS % 32 == 0, "whole warps");

__global__ void __launch_bounds__(THREADS) kernel(const float* __restrict__ x, float* __restrict__ y, int rows,
                                                  int cols)
{
    const int row0 = blockIdx.x * ROWS_PER_BLOCK;
    for (int r = row0; r < min(row0 + ROWS_PER_BLOCK, rows); ++r)
        for (int c = threadIdx.x; c < cols; c += THREADS) y[r * cols + c] = x[r * cols + c];
}
