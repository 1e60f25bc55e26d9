__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int B, int T, int D) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    if (t >= T) return;
    float ss = 0.0f;
    for (int d = 0; d < D; ++d) ss += x[(b * T + t) * D + d] * x[(b * T + t) * D + d];
    float s = rsqrtf(ss / D + 1e-6f);
    for (int d = 0; d < D; ++d) y[(b * T + t) * D + d] = x[(b * T + t) * D + d] * s * w[d];
}
