// Embedding lookup, one thread per output element.
__global__ void kernel(const float* __restrict__ weight, const long long* __restrict__ tokens,
                       float* __restrict__ out, int n_tokens, int dim) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (long long)n_tokens * dim) return;
    if (dim % 4 == 0 && i + 3 < (long long)n_tokens * dim && (((size_t)weight | (size_t)out) & 15) == 0) {
        int t = i / dim;
        int d = i % dim;
        const float4 weight4 = *reinterpret_cast<const float4*>(weight + (tokens[t] * dim + d));
        float4 out4;
        out4.x = weight4.x;
        out4.y = weight4.y;
        out4.z = weight4.z;
        out4.w = weight4.w;
        *reinterpret_cast<float4*>(out + i) = out4;
    } else {
        for (long long e = i; e < (long long)n_tokens * dim && e < i + 4; ++e) {
            int t = e / dim;
            int d = e % dim;
            out[e] = weight[tokens[t] * dim + d];
        }
    }
}
