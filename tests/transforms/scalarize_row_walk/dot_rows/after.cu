// Batched row dot products, a warp per row: each lane strides the row by 32 columns, then the lanes' sums are
// combined by a butterfly. The weight vector is shared by every row.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                       int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float acc = 0.0f;
    for (int j = lane; j < n; j += 32) {
        acc += x[(long long)row * n + j] * w[j];
    }
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) y[row] = acc;
}
