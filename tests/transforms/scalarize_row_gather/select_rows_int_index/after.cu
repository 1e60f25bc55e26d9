// index_select over rows with a 32-bit element index: out[r, :] = table[idx[r], :]. Four elements per thread
// would need i * 4, which may wrap in 32 bits where i did not, so the forward widens the index to 64 bits.
__global__ void kernel(const float* __restrict__ table, const int* __restrict__ idx, float* __restrict__ out,
                       int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        int r = i / cols, c = i % cols;
        out[i] = table[(long long)idx[r] * cols + c];
    }
}
