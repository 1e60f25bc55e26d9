// One block a row: each thread sums a stride of the row, then a shared-memory tree adds the block's sums.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    __shared__ float partial[256];
    const int tid = threadIdx.x;
    const float* row = x + (long long)blockIdx.x * cols;
    float acc = 0.0f;
    for (int c = tid; c < cols; c += blockDim.x) acc += row[c];
    {
        float partial_v = acc;
        for (int partial_o = 16; partial_o > 0; partial_o >>= 1) partial_v = partial_v + __shfl_down_sync(0xffffffffu, partial_v, partial_o);
        if ((tid & 31) == 0) partial[tid >> 5] = partial_v;
        __syncthreads();
        if (tid < 32) {
            const int partial_n = blockDim.x >> 5;
            partial_v = tid < partial_n ? partial[tid] : partial_v;
            for (int partial_o = 16; partial_o > 0; partial_o >>= 1) {
                float partial_w = __shfl_down_sync(0xffffffffu, partial_v, partial_o);
                if (tid + partial_o < partial_n) partial_v = partial_v + partial_w;
            }
            if (tid == 0) partial[0] = partial_v;
        }
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = partial[0];
}
