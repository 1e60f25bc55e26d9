// The affine step after a normalization: out = x * gamma + beta, gamma and beta one value per column, the column
// written out in each subscript.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
                       float* __restrict__ out, int n, int cols) {
    long long i = (long long)(blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i < n) if (cols % 4 == 0 && i + 3 < n && (((size_t)x | (size_t)gamma | (size_t)beta | (size_t)out) & 15) == 0) {
        const float4 x4 = *reinterpret_cast<const float4*>(x + i);
        const float4 gamma4 = *reinterpret_cast<const float4*>(gamma + (i % cols));
        const float4 beta4 = *reinterpret_cast<const float4*>(beta + (i % cols));
        float4 out4;
        out4.x = x4.x * gamma4.x + beta4.x;
        out4.y = x4.y * gamma4.y + beta4.y;
        out4.z = x4.z * gamma4.z + beta4.z;
        out4.w = x4.w * gamma4.w + beta4.w;
        *reinterpret_cast<float4*>(out + i) = out4;
    } else {
        for (long long e = i; e < n && e < i + 4; ++e) {
            out[e] = x[e] * gamma[e % cols] + beta[e % cols];
        }
    }
}
