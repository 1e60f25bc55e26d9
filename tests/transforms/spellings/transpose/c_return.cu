__global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    const int col = threadIdx.x + blockIdx.x * blockDim.x;
    const int row = threadIdx.y + blockIdx.y * blockDim.y;
    if (row >= rows || col >= cols) return;
    y[(size_t)col * rows + row] = x[(size_t)row * cols + col];
}
