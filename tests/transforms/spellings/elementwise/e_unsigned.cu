__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (unsigned)n) y[i] = logf(1.0f + expf(x[i]));
}
