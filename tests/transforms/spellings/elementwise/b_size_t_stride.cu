__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)n; i += (size_t)blockDim.x * gridDim.x) {
        y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
    }
}
