// Mean pooling over the middle axis of (B, N, D) to (B, D): one thread per output walks down column d of batch b.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int B, int N, int D) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) / 32 * 8 + threadIdx.x % 8;
    const int slice = threadIdx.x % 32 / 8;
    const unsigned slice_mask = 0x01010101u << (threadIdx.x % 8);
    if (i >= B * D) return;
    int b = i / D, d = i % D;
    float s = 0.0f;
    for (int n = slice; n < N; n += 4) s += x[((size_t)b * N + n) * D + d];
    for (int offset = 16; offset >= 8; offset /= 2) s += __shfl_xor_sync(slice_mask, s, offset);
    out[i] = s / N;
}
