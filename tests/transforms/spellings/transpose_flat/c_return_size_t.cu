__global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    size_t r = i / cols, c = i % cols;
    y[c * rows + r] = __ldg(&x[i]);
}
