// out = gelu(g) * u (tanh approximation), and the integer mask of positive gates; one thread per element.
__global__ void kernel(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                       int* __restrict__ mask, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
        out[i] = 0.5f * v * (1.0f + tanhf(inner)) * u[i];
        mask[i] = v > 0.0f;
    }
}
