// The largest magnitude of each thread's grid-stride slice; a second pass reduces the partials.
__global__ void kernel(const float* x, float* partial, int n) {
    float m = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        m = fmaxf(m, fabsf(x[i]));
    }
    partial[blockIdx.x * blockDim.x + threadIdx.x] = m;
}
