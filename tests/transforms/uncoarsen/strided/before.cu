// The L2 norm of every row of a rows x cols matrix: each thread takes ROWS_PER_THREAD rows, a block's
// width apart, so a warp's threads start on neighbouring rows.

constexpr int ROWS_PER_THREAD = 2;

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int base = blockIdx.x * (blockDim.x * ROWS_PER_THREAD) + threadIdx.x;
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        const int row = base + r * blockDim.x;
        if (row < rows) {
            const float* xr = x + static_cast<long long>(row) * cols;
            float s = 0.0f;
            for (int c = 0; c < cols; ++c) s = fmaf(xr[c], xr[c], s);
            y[row] = sqrtf(s);
        }
    }
}
