// Mean pooling over the middle axis of (B, N, D) to (B, D): one thread per output walks down column d of batch b.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int B, int N, int D, int split_steps, float* __restrict__ split_s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * D) return;
    int b = i / D, d = i % D;
    float s = 0.0f;
    const int split_first = (int)blockIdx.y * split_steps;
    for (int n = split_first; n < N && n < split_first + split_steps; ++n) s += x[((size_t)b * N + n) * D + d];
    split_s[(size_t)blockIdx.y * B * D + i] = s;
}

__global__ void kernel_merge(const float* __restrict__ x, float* __restrict__ out, int B, int N, int D, int split_steps, const float* __restrict__ split_s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * D) return;
    int b = i / D, d = i % D;
    float s = 0.0f;
    for (int split = 0; split < (N + split_steps - 1) / split_steps; ++split) {
        s += split_s[(size_t)split * B * D + i];
    }
    out[i] = s / N;
}
