// A specialized template: float4 lanes and a scalar tail that divide by the same float(10) are one site.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n && (((size_t)x | (size_t)y) & 15) == 0) {
        const float4 v = *reinterpret_cast<const float4*>(x + i);
        float4 w;
        w.x = (v.x - float(1)) / float(10);
        w.y = (v.y - float(1)) / float(10);
        w.z = (v.z - float(1)) / float(10);
        w.w = (v.w - float(1)) / float(10);
        *reinterpret_cast<float4*>(y + i) = w;
    } else {
        for (int e = i; e < n && e < i + 4; ++e) {
            y[e] = (x[e] - float(1)) / float(10) + x[e] / 3.0f;
        }
    }
}
