// Naive scatter-add: zero the table, then one thread per source element adds it with one atomic.
__global__ void zero(float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0.0f;
}

__global__ void scatter_add(const float* __restrict__ src, const int* __restrict__ idx, float* __restrict__ out,
                            int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = i / cols, c = i % cols;
    atomicAdd(&out[(long long)idx[r] * cols + c], src[i]);
}
