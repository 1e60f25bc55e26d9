// Rows scaled by their sums, a block a row: the block's threads add their partial sums into one shared total with
// atomics, then every thread reads the total after a barrier.
__global__ void kernel(const int* x, int* y, int rows, int cols) {
    __shared__ int row_sum;
    if (threadIdx.x == 0) row_sum = 0;
    __syncthreads();
    int part = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) part += x[blockIdx.x * cols + j];
    atomicAdd(&row_sum, part);
    __syncthreads();
    for (int j = threadIdx.x; j < cols; j += blockDim.x) y[blockIdx.x * cols + j] = x[blockIdx.x * cols + j] * row_sum;
}
