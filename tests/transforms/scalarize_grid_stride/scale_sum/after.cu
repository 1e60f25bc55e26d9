// Scale each element and sum what was written.
__global__ void kernel(const float* x, float* y, float* total, float scale, int n) {
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = scale * x[i];
        s += y[i];
    }
    atomicAdd(total, s);
}
