// The largest magnitude of each thread's slice, in the `while` spelling; a second pass reduces the partials.
__global__ void kernel(const float* x, float* partial, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float m = 0.0f;
    while (i < n) {
        m = fmaxf(m, fabsf(x[i]));
        i += blockDim.x * gridDim.x;
    }
    partial[blockIdx.x * blockDim.x + threadIdx.x] = m;
}
