__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    while (i < n) {
        y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
        i += blockDim.x * gridDim.x;
    }
}
