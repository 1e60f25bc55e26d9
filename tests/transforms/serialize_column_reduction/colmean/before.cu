// Column mean and maximum, one thread per column walking down every row (a bias gradient's shape).
__global__ void kernel(const float* __restrict__ x, float* __restrict__ mean, float* __restrict__ peak, int rows,
                       int cols) {
    int c = (blockIdx.x * blockDim.x + threadIdx.x) / 32 * 8 + threadIdx.x % 8;
    const int slice = threadIdx.x % 32 / 8;
    const unsigned slice_mask = 0x01010101u << (threadIdx.x % 8);
    if (c >= cols) return;
    float s = 0.0f;
    float top = -INFINITY;
    for (int r = slice; r < rows; r += 4) {
        const float v = x[(long long)r * cols + c];
        s += v;
        top = fmaxf(top, v);
    }
    for (int offset = 16; offset >= 8; offset /= 2) s += __shfl_xor_sync(slice_mask, s, offset);
    for (int offset = 16; offset >= 8; offset /= 2) top = fmaxf(top, __shfl_xor_sync(slice_mask, top, offset));
    mean[c] = s / rows;
    peak[c] = top;
}
