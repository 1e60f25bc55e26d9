// Block-wide sums of TILE_SIZE consecutive floats per block, in shared memory.
#define TILE_SIZE 256
#define HALF (TILE_SIZE / 2)

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[TILE_SIZE];
    for (int i = threadIdx.x; i < TILE_SIZE; i += blockDim.x) tile[i] = x[blockIdx.x * TILE_SIZE + i];
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int i = 0; i < HALF; ++i) sum += tile[i] + tile[i + HALF];
        y[blockIdx.x] = sum;
    }
}
