// Warp maximum by a down-shift tree (a loop without braces): only lane 0 ends with the maximum.
__device__ __forceinline__ float warp_max_to_lane0(float v)
{
    __shared__ float shfl_scratch0[32][32];  // shuffle_to_shared scratch: a 32-slot row per warp; loop body braced
    float* const shfl_row0 = shfl_scratch0[threadIdx.x >> 5];
    const int shfl_lane0 = threadIdx.x & 31;
    for (int offset = 16; offset > 0; offset /= 2)
        {
            shfl_row0[shfl_lane0] = v;
            __syncwarp(0xffffffffu);
            v = fmaxf(v, shfl_row0[shfl_lane0 + offset < 32 ? shfl_lane0 + offset : shfl_lane0]);
            __syncwarp(0xffffffffu);
        }
    return v;
}

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float m = warp_max_to_lane0(x[i]);
    if ((threadIdx.x & 31) == 0) out[i / 32] = m;
}
