__device__ __forceinline__ float sp(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = sp(x[i]);
}
