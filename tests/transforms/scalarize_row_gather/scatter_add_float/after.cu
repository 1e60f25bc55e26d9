// Rows of a matrix added into the rows an index array names (index_add / scatter_add along rows), each element with
// one atomic: out[idx[r], :] += w[r] * src[r, :].
__global__ void kernel(const float* __restrict__ src, const int* __restrict__ idx, const float* __restrict__ w,
                       float* __restrict__ out, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = i / cols;
    int c = i % cols;
    atomicAdd(&out[(long long)idx[r] * cols + c], w[r] * src[i]);
}
