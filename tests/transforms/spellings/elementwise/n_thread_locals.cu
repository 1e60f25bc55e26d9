__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    const int tid = threadIdx.x;
    const int bid = blockIdx.x;
    const int i = bid * blockDim.x + tid;
    if (i >= n) { return; }
    y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
}
