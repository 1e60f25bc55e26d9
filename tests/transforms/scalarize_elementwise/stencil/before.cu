// y = a 3-point smoothing of x, zero beyond its ends: each element reads its neighbours at other indexes than
// its own (a gather every lane does for itself), and the index is a value too; one thread per element.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n && (((size_t)x | (size_t)y) & 15) == 0) {
        const float4 x4 = *reinterpret_cast<const float4*>(x + i);
        float4 y4;
        {
            float left = i > 0 ? x[i - 1] : 0.0f;
            float right = i + 1 < n ? x[i + 1] : 0.0f;
            y4.x = 0.25f * left + 0.5f * x4.x + 0.25f * right;
        }
        {
            float left = (i + 1) > 0 ? x[(i + 1) - 1] : 0.0f;
            float right = (i + 1) + 1 < n ? x[(i + 1) + 1] : 0.0f;
            y4.y = 0.25f * left + 0.5f * x4.y + 0.25f * right;
        }
        {
            float left = (i + 2) > 0 ? x[(i + 2) - 1] : 0.0f;
            float right = (i + 2) + 1 < n ? x[(i + 2) + 1] : 0.0f;
            y4.z = 0.25f * left + 0.5f * x4.z + 0.25f * right;
        }
        {
            float left = (i + 3) > 0 ? x[(i + 3) - 1] : 0.0f;
            float right = (i + 3) + 1 < n ? x[(i + 3) + 1] : 0.0f;
            y4.w = 0.25f * left + 0.5f * x4.w + 0.25f * right;
        }
        *reinterpret_cast<float4*>(y + i) = y4;
    } else {
        for (int e = i; e < n && e < i + 4; ++e) {
            float left = e > 0 ? x[e - 1] : 0.0f;
            float right = e + 1 < n ? x[e + 1] : 0.0f;
            y[e] = 0.25f * left + 0.5f * x[e] + 0.25f * right;
        }
    }
}
