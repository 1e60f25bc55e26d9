__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        float v = __ldg(&x[idx]);
        y[idx] = v > 20.0f ? v : log1pf(expf(v));
    }
}
