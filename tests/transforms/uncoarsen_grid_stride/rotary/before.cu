// Rotary embedding on interleaved pairs, one thread per pair of x, cos and sin per (token, pair);
// the pairs per token a local of the parameters, which stays before the loop.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int tokens, int dim) {
    const int half = dim / 2;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < tokens * half; i += gridDim.x * blockDim.x) {
        int t = i / half, p = i % half;
        float x0 = x[t * dim + 2 * p], x1 = x[t * dim + 2 * p + 1];
        float c = cos_t[t * half + p], s = sin_t[t * half + p];
        y[t * dim + 2 * p] = x0 * c - x1 * s;
        y[t * dim + 2 * p + 1] = x0 * s + x1 * c;
    }
}
