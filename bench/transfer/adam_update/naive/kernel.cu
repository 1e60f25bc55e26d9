// Naive fused Adam step: one thread per parameter.
__global__ void adam_update(const float* __restrict__ p, const float* __restrict__ g, const float* __restrict__ m,
                            const float* __restrict__ v, float* __restrict__ p_out, float* __restrict__ m_out,
                            float* __restrict__ v_out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float grad = g[i];
        float m1 = 0.9f * m[i] + 0.1f * grad;
        float v1 = 0.999f * v[i] + 0.001f * grad * grad;
        float m_hat = m1 / (1.0f - 0.3486784401f);  // 0.9^10
        float v_hat = v1 / (1.0f - 0.9900448802f);  // 0.999^10
        p_out[i] = p[i] - 1e-3f * m_hat / (sqrtf(v_hat) + 1e-8f);
        m_out[i] = m1;
        v_out[i] = v1;
    }
}
