// Rows scaled to unit maximum, written for fix_grid_cap's tests: each block takes rows a grid apart (a block-stride
// loop), finds a row's largest magnitude in shared memory and scales the row; the grid is num_sms * 4 blocks.
#define THREADS 128

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    __shared__ float peak[THREADS];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        float m = 0.0f;
        for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, fabsf(x[(size_t)r * cols + c]));
        peak[threadIdx.x] = m;
        __syncthreads();
        for (int half = THREADS / 2; half > 0; half /= 2) {
            if (threadIdx.x < half) peak[threadIdx.x] = fmaxf(peak[threadIdx.x], peak[threadIdx.x + half]);
            __syncthreads();
        }
        const float scale = peak[0] > 0.0f ? 1.0f / peak[0] : 0.0f;
        for (int c = threadIdx.x; c < cols; c += THREADS) y[(size_t)r * cols + c] = x[(size_t)r * cols + c] * scale;
        __syncthreads();
    }
}
