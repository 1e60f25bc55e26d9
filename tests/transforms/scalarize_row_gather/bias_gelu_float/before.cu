// A bias add, GELU and a per-channel scale, one thread per element of a rows x cols matrix: bias[c] and scale[c]
// are read by every row (column broadcasts).
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ bias, const float* __restrict__ scale,
                       float* __restrict__ out, int n, int cols) {
    long long i = (long long)(blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i < n) {
        if (cols % 4 == 0 && i + 3 < n && (((size_t)x | (size_t)bias | (size_t)scale | (size_t)out) & 15) == 0) {
            int c = i % cols;
            const float4 x4 = *reinterpret_cast<const float4*>(x + i);
            const float4 bias4 = *reinterpret_cast<const float4*>(bias + c);
            const float4 scale4 = *reinterpret_cast<const float4*>(scale + c);
            float4 out4;
            {
                float v = x4.x + bias4.x;
                out4.x = 0.5f * v * (1.0f + erff(v * 0.70710678f)) * scale4.x;
            }
            {
                float v = x4.y + bias4.y;
                out4.y = 0.5f * v * (1.0f + erff(v * 0.70710678f)) * scale4.y;
            }
            {
                float v = x4.z + bias4.z;
                out4.z = 0.5f * v * (1.0f + erff(v * 0.70710678f)) * scale4.z;
            }
            {
                float v = x4.w + bias4.w;
                out4.w = 0.5f * v * (1.0f + erff(v * 0.70710678f)) * scale4.w;
            }
            *reinterpret_cast<float4*>(out + i) = out4;
        } else {
            for (long long e = i; e < n && e < i + 4; ++e) {
                int c = e % cols;
                float v = x[e] + bias[c];
                out[e] = 0.5f * v * (1.0f + erff(v * 0.70710678f)) * scale[c];
            }
        }
    }
}
