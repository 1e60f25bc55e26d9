// Product of each row (torch.prod over the last dimension), one thread per row.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float product = 1.0f;
    for (int j = lane; j < n; j += 32) product *= x[row * n + j];
    for (int offset = 16; offset > 0; offset /= 2) product *= __shfl_xor_sync(0xffffffffu, product, offset);
    y[row] = product;
}
