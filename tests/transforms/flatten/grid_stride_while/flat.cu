// y = softplus(x) in a grid-stride `while` loop on a grid of a fixed size, the stride declared after the index.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 20.0f ? v : log1pf(expf(v));
    }
}
