__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    const size_t stride = (size_t)blockDim.x * gridDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    while (i < (size_t)n) {
        const float v = x[i];
        y[i] = v > 20.0f ? v : log1pf(expf(v));
        i += stride;
    }
}
