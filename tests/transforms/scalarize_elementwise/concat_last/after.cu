// Concatenation along the last dim, out[r, :] = [a[r, :], b[r, :]], one thread per output element; the row
// length a local between the index and the guard, the guard's bound a product of it.
__global__ void kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                       int rows, int ca, int cb) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int cols = ca + cb;
    if (i < rows * cols) {
        int r = i / cols, c = i % cols;
        out[i] = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
    }
}
