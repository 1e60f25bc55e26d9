// y = a * x + b, one thread per element.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float a, float b, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n && (((size_t)x | (size_t)y) & 15) == 0) {
        const float4 x4 = *reinterpret_cast<const float4*>(x + i);
        float4 y4;
        { y4.x = a * x4.x + b; }
        { y4.y = a * x4.y + b; }
        { y4.z = a * x4.z + b; }
        { y4.w = a * x4.w + b; }
        *reinterpret_cast<float4*>(y + i) = y4;
    } else {
        for (int e = i; e < n && e < i + 4; ++e) y[e] = a * x[e] + b;
    }
}
