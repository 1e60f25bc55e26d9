// y = x * scale where the byte mask keeps the element, else 0: a float array and a byte array side by side.
__global__ void kernel(const float* __restrict__ x, const unsigned char* __restrict__ mask, float* __restrict__ y,
                       int n, float scale) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n && (((size_t)mask | (size_t)x | (size_t)y) & 15) == 0) {
        const uchar4 mask4 = *reinterpret_cast<const uchar4*>(mask + i);
        const float4 x4 = *reinterpret_cast<const float4*>(x + i);
        float4 y4;
        { y4.x = mask4.x ? x4.x * scale : 0.0f; }
        { y4.y = mask4.y ? x4.y * scale : 0.0f; }
        { y4.z = mask4.z ? x4.z * scale : 0.0f; }
        { y4.w = mask4.w ? x4.w * scale : 0.0f; }
        *reinterpret_cast<float4*>(y + i) = y4;
    } else {
        for (int e = i; e < n && e < i + 4; ++e) y[e] = mask[e] ? x[e] * scale : 0.0f;
    }
}
