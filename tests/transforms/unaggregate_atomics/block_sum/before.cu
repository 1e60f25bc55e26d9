// Rows scaled by their sums, a block a row: the block's threads add their partial sums into one shared total with
// atomics, then every thread reads the total after a barrier.
__global__ void kernel(const int* x, int* y, int rows, int cols) {
    __shared__ int row_sum;
    if (threadIdx.x == 0) row_sum = 0;
    __syncthreads();
    int part = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) part += x[blockIdx.x * cols + j];
    int warp_total = part;
    for (int offset = 16; offset > 0; offset /= 2) warp_total += __shfl_xor_sync(0xffffffffu, warp_total, offset);
    if (threadIdx.x % 32 == 0) atomicAdd(&row_sum, warp_total);
    __syncthreads();
    for (int j = threadIdx.x; j < cols; j += blockDim.x) y[blockIdx.x * cols + j] = x[blockIdx.x * cols + j] * row_sum;
}
