// Block-wide sum of 128 floats per block; the bounds let ptxas budget registers for 4 blocks per SM.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float partial[128];
    partial[threadIdx.x] = x[blockIdx.x * 128 + threadIdx.x];
    __syncthreads();
    for (int s = 64; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = partial[0];
}
