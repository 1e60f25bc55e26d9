// Embedding lookup, one thread per output element.
__global__ void kernel(const float* __restrict__ weight, const long long* __restrict__ tokens,
                       float* __restrict__ out, int n_tokens, int dim) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tokens * dim) return;
    int t = i / dim;
    int d = i % dim;
    out[i] = weight[tokens[t] * dim + d];
}
