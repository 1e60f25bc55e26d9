// One block a row: each thread sums a stride of the row, then a shared-memory tree adds the block's sums.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    __shared__ float partial[256];
    const int tid = threadIdx.x;
    const float* row = x + (long long)blockIdx.x * cols;
    float acc = 0.0f;
    for (int c = tid; c < cols; c += blockDim.x) acc += row[c];
    partial[tid] = acc;
    __syncthreads();
    for (int partial_s = blockDim.x / 2; partial_s > 0; partial_s >>= 1) {
        if (tid < partial_s) partial[tid] = partial[tid] + partial[tid + partial_s];
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = partial[0];
}
