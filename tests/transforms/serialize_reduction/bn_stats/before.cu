// Per-channel batch-norm statistics (one thread per channel): a nest over the images and their pixels.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ mean, float* __restrict__ var, int N, int C,
                       int HW) {
    int c = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (c >= C) return;
    float s = 0.0f, q = 0.0f;
    for (long long n_k = lane; n_k < (long long)N * HW; n_k += 32) {
        int n = n_k / HW;
        int k = n_k % HW;
        float v = x[((long long)n * C + c) * HW + k];
        s += v;
        q += v * v;
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    for (int offset = 16; offset > 0; offset /= 2) q += __shfl_xor_sync(0xffffffffu, q, offset);
    float m = s / (N * HW);
    mean[c] = m;
    var[c] = q / (N * HW) - m * m;
}
