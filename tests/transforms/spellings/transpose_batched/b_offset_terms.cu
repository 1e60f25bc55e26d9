__global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int batch, int rows, int cols) {
    const int b = blockIdx.z;
    const int col = threadIdx.x + blockIdx.x * blockDim.x;
    const int row = threadIdx.y + blockIdx.y * blockDim.y;
    if (row >= rows || col >= cols) return;
    y[b * rows * cols + col * rows + row] = x[b * (rows * cols) + row * cols + col];
}
