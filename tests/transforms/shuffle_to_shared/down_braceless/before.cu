// Warp maximum by a down-shift tree (a loop without braces): only lane 0 ends with the maximum.
__device__ __forceinline__ float warp_max_to_lane0(float v)
{
    for (int offset = 16; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));
    return v;
}

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float m = warp_max_to_lane0(x[i]);
    if ((threadIdx.x & 31) == 0) out[i / 32] = m;
}
