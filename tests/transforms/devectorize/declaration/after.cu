// `float4 v = p4[i];` becomes four scalar loads into v.x .. v.w from p[4 * i + 0 .. 3].
__global__ void kernel(const float* __restrict__ p, float* __restrict__ out, int n)
{
    const float4* p4 = reinterpret_cast<const float4*>(p);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 4) {
        float4 v;
        v.x = p[4 * i];
        v.y = p[4 * i + 1];
        v.z = p[4 * i + 2];
        v.w = p[4 * i + 3];
        out[i] = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
    }
}
