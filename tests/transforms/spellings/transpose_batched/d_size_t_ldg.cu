__global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int batch, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    size_t b = blockIdx.z;
    if (r < rows && c < cols) {
        y[b * cols * rows + c * rows + r] = __ldg(&x[(b * rows + r) * cols + c]);
    }
}
