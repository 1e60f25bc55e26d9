// Naive gather: one thread per output element.
__global__ void gather_rows(const float* __restrict__ table, const int* __restrict__ idx, float* __restrict__ out,
                            int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = i / cols, c = i % cols;
    out[i] = table[(long long)idx[r] * cols + c];
}
