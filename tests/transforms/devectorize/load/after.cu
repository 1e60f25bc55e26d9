// A 128-bit load through a float4 view of a float buffer, into a register array (as in top-k's row load).
constexpr int BATCH = 2;

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    const int nvec = n / 4;
    float4 v[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
        const int j = threadIdx.x + b * blockDim.x;
        if (j < nvec) {
            v[b].x = __ldg(x + 4 * j);
            v[b].y = __ldg(x + 4 * j + 1);
            v[b].z = __ldg(x + 4 * j + 2);
            v[b].w = __ldg(x + 4 * j + 3);
        }
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
        const int j = threadIdx.x + b * blockDim.x;
        if (j < nvec) y[j] = v[b].x + v[b].y + v[b].z + v[b].w;
    }
}
