// y = a * x + y written for reroll_grid_stride's tests, the grid's extent a local as CUDA's own samples write it and
// the block size the source's constant; a 64-bit index.
#define THREADS 128

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float a, long long n) {
    const long long stride = (long long)gridDim.x * THREADS;
    for (long long i_base = (long long)blockIdx.x * THREADS + threadIdx.x; i_base < n; i_base += 2 * (stride)) {
        if (i_base + 1 * (stride) < n) {
#pragma unroll
            for (int i_step = 0; i_step < 2; ++i_step) {
                const long long i = i_base + i_step * (stride);
                {
                    y[i] = a * x[i] + y[i];
                }
            }
        } else {
#pragma unroll
            for (int i_step = 0; i_step < 2; ++i_step) {
                const long long i = i_base + i_step * (stride);
                if (i < n) {
                    y[i] = a * x[i] + y[i];
                }
            }
        }
    }
}
