__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float threshold = 20.0f;
    if (i >= n) return;
    const float v = x[i];
    y[i] = v > threshold ? v : log1pf(expf(v));
}
