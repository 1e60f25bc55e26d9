// Transpose of a rows x cols matrix, one thread per element on a 1-D index split into a row and a column.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    __shared__ float tile[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r = blockIdx.y * 32 + threadIdx.y;
    for (int k = 0; k < 32; k += 8)
        if (r + k < rows && c < cols) tile[threadIdx.y + k][threadIdx.x] = x[(r + k) * cols + c];
    __syncthreads();
    int c_out = blockIdx.y * 32 + threadIdx.x;
    int r_out = blockIdx.x * 32 + threadIdx.y;
    for (int k = 0; k < 32; k += 8)
        if (r_out + k < cols && c_out < rows) y[(r_out + k) * rows + c_out] = tile[threadIdx.x][threadIdx.y + k];
}
