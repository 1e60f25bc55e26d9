// out = gelu(g) * u (tanh approximation), and the integer mask of positive gates; one thread per element.
__global__ void kernel(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                       int* __restrict__ mask, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n && (((size_t)g | (size_t)u | (size_t)out | (size_t)mask) & 15) == 0) {
        const float4 g4 = *reinterpret_cast<const float4*>(g + i);
        const float4 u4 = *reinterpret_cast<const float4*>(u + i);
        float4 out4;
        int4 mask4;
        {
            float v = g4.x;
            float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
            out4.x = 0.5f * v * (1.0f + tanhf(inner)) * u4.x;
            mask4.x = v > 0.0f;
        }
        {
            float v = g4.y;
            float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
            out4.y = 0.5f * v * (1.0f + tanhf(inner)) * u4.y;
            mask4.y = v > 0.0f;
        }
        {
            float v = g4.z;
            float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
            out4.z = 0.5f * v * (1.0f + tanhf(inner)) * u4.z;
            mask4.z = v > 0.0f;
        }
        {
            float v = g4.w;
            float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
            out4.w = 0.5f * v * (1.0f + tanhf(inner)) * u4.w;
            mask4.w = v > 0.0f;
        }
        *reinterpret_cast<float4*>(out + i) = out4;
        *reinterpret_cast<int4*>(mask + i) = mask4;
    } else {
        for (int e = i; e < n && e < i + 4; ++e) {
            float v = g[e];
            float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
            out[e] = 0.5f * v * (1.0f + tanhf(inner)) * u[e];
            mask[e] = v > 0.0f;
        }
    }
}
