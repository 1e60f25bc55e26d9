// y = a * x + y written for reroll_grid_stride's tests, the grid's extent a local as CUDA's own samples write it and
// the block size the source's constant; a 64-bit index.
#define THREADS 128

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float a, long long n) {
    const long long stride = (long long)gridDim.x * THREADS;
    for (long long i = (long long)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride) {
        y[i] = a * x[i] + y[i];
    }
}
