// A batch of transposes, (batch, rows, cols) -> (batch, cols, rows), one thread per element, the matrix from grid z.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int batch, int rows, int cols) {
    __shared__ float tile[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r = blockIdx.y * 32 + threadIdx.y;
    int b = blockIdx.z;
    for (int k = 0; k < 32; k += 8)
        if (r + k < rows && c < cols) tile[threadIdx.y + k][threadIdx.x] = x[(b * rows + r + k) * cols + c];
    __syncthreads();
    int c_out = blockIdx.y * 32 + threadIdx.x;
    int r_out = blockIdx.x * 32 + threadIdx.y;
    for (int k = 0; k < 32; k += 8)
        if (r_out + k < cols && c_out < rows) y[(b * cols + r_out + k) * rows + c_out] = tile[threadIdx.x][threadIdx.y + k];
}
