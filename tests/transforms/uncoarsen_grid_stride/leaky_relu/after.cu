// y = x where x > 0, else 0.01 x; one thread per element.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.01f * v;
    }
}
