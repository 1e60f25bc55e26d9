// Mean pooling over the middle axis of (B, N, D) to (B, D): one thread per output walks down column d of batch b.
constexpr int SPLIT = 128;  // the steps a chunk reduces

__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int B, int N, int D, float* __restrict__ split_s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * D) return;
    int b = i / D, d = i % D;
    float s = 0.0f;
    const int split_first = (int)blockIdx.y * SPLIT;
    for (int n = split_first; n < N && n < split_first + SPLIT; ++n) s += x[((size_t)b * N + n) * D + d];
    split_s[(size_t)blockIdx.y * B * D + i] = s;
}

__global__ void kernel_merge(const float* __restrict__ x, float* __restrict__ out, int B, int N, int D, const float* __restrict__ split_s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * D) return;
    int b = i / D, d = i % D;
    float s = 0.0f;
    for (int split = 0; split < (N + SPLIT - 1) / SPLIT; ++split) {
        s += split_s[(size_t)split * B * D + i];
    }
    out[i] = s / N;
}
