// y = x * scale[row] + shift[col] on 16x16 tiles of threads, 64-bit offsets, the guard as an early return.
__global__ void kernel(const float* x, const float* scale, const float* shift, float* y, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)rows * cols) {
        int row = i / cols;
        int col = i % cols;
        y[i] = x[i] * scale[row] + shift[col];
    }
}
