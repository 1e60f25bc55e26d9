// Naive fused gelu(gate) * up: one thread per element.
__global__ void gelu_mul(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + erff(g * 0.70710678f)) * up[i];
    }
}
