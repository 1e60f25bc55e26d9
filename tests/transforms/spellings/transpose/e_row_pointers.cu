// The source row and the destination column's start named by local pointers; the block's rows by a macro.
#define BLOCK_ROWS 8
__global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * BLOCK_ROWS + threadIdx.y;
    if (row < rows && col < cols) {
        const float* src = x + row * cols;
        float* dst = y + col * rows;
        dst[row] = src[col];
    }
}
