// Weighted rows, a warp per row: each row scaled column by column by a weight vector into y, and its weighted
// sum into total.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                       float* __restrict__ total, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float acc = 0.0f;
    for (int j = lane; j < n; j += 32) {
        const float v = x[(long long)row * n + j] * w[j];
        y[(long long)row * n + j] = v;
        acc += v;
    }
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) total[row] = acc;
}
