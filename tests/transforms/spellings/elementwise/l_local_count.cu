__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    const long long count = n;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const float one = 1.0f;
    if (i < count) { y[i] = logf(one + expf(x[i])); }
}
