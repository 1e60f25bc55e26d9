// Row sums of a [rows, cols] fp32 matrix (cols <= 64, cols % 4 == 0), one block of 16 threads per
// row: each thread fetches one 16-byte chunk of the row with __pipeline_memcpy_async (chunks past
// `cols` are zero-filled), then thread 0 adds up the staged row.
#include <cuda_pipeline.h>

constexpr int THREADS = 16;
constexpr int WIDTH = THREADS * 4;

extern "C" __global__ void __launch_bounds__(THREADS)
kernel(const float* __restrict__ x, float* __restrict__ y, int cols)
{
    __shared__ __align__(16) float row[WIDTH];
    const int c = 4 * threadIdx.x;
    const bool inside = c < cols;
    const float* src = x + blockIdx.x * cols + (inside ? c : 0);
    __pipeline_memcpy_async(&row[c], src, 16, inside ? 0 : 16);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int i = 0; i < WIDTH; ++i) total += row[i];
        y[blockIdx.x] = total;
    }
}
