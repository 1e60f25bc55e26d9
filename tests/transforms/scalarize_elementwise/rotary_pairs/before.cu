// Rotary embedding on interleaved pairs, one thread per pair: both elements of pair i read and written at
// [2 * i] and [2 * i + 1], its cos and sin at [i].
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int pairs) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (i + 1 < pairs && (((size_t)x | (size_t)y) & 15) == 0) {
        const float4 x4 = *reinterpret_cast<const float4*>(x + 2 * i);
        float4 y4;
        {
            float x0 = x4.x, x1 = x4.y;
            y4.x = x0 * cos_t[i] - x1 * sin_t[i];
            y4.y = x0 * sin_t[i] + x1 * cos_t[i];
        }
        {
            float x0 = x4.z, x1 = x4.w;
            y4.z = x0 * cos_t[(i + 1)] - x1 * sin_t[(i + 1)];
            y4.w = x0 * sin_t[(i + 1)] + x1 * cos_t[(i + 1)];
        }
        *reinterpret_cast<float4*>(y + 2 * i) = y4;
    } else {
        for (int e = i; e < pairs && e < i + 2; ++e) {
            float x0 = x[2 * e], x1 = x[2 * e + 1];
            y[2 * e] = x0 * cos_t[e] - x1 * sin_t[e];
            y[2 * e + 1] = x0 * sin_t[e] + x1 * cos_t[e];
        }
    }
}
