// Mean pooling over the middle axis of (B, N, D) to (B, D): one thread per output walks down column d of batch b.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int B, int N, int D) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * D) return;
    int b = i / D, d = i % D;
    float s = 0.0f;
    for (int n = 0; n < N; ++n) s += x[((size_t)b * N + n) * D + d];
    out[i] = s / N;
}
