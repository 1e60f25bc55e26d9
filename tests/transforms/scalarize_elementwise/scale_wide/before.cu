// y = a * x + b, one thread per element, a 64-bit element index (n past 2^31 elements).
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float a, float b, long long n) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n && (((size_t)x | (size_t)y) & 15) == 0) {
        const float4 x4 = *reinterpret_cast<const float4*>(x + i);
        float4 y4;
        { y4.x = a * x4.x + b; }
        { y4.y = a * x4.y + b; }
        { y4.z = a * x4.z + b; }
        { y4.w = a * x4.w + b; }
        *reinterpret_cast<float4*>(y + i) = y4;
    } else {
        for (long long e = i; e < n && e < i + 4; ++e) y[e] = a * x[e] + b;
    }
}
