__global__ void softplus(const float* x, float* y, int n) {
    const int i = threadIdx.x + blockDim.x * blockIdx.x;
    if (i < n) {
        const float v = x[i];
        float r;
        if (v > 20.0f) r = v; else r = log1pf(expf(v));
        y[i] = r;
    }
}
