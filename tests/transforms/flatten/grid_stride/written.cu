// y = softplus(x) in a grid-stride loop on a grid of a fixed size, the stride declared first.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    const int stride = gridDim.x * blockDim.x;
    for (int i = threadIdx.x + blockIdx.x * blockDim.x; i < n; i += stride) {
        float v = x[i];
        y[i] = v > 20.0f ? v : log1pf(expf(v));
    }
}
