// Warp maximum by an xor butterfly with increasing offsets, the loop and its body on one line.
__device__ __forceinline__ float warp_max(float v)
{
    __shared__ float shfl_scratch0[32][32];  // shuffle_to_shared scratch: a 32-slot row per warp; loop body braced
    float* const shfl_row0 = shfl_scratch0[threadIdx.x >> 5];
    const int shfl_lane0 = threadIdx.x & 31;
    for (int offset = 1; offset < 32; offset <<= 1) {
        shfl_row0[shfl_lane0] = v;
        __syncwarp(0xffffffffu);
        v = fmaxf(v, *(shfl_row0 + ((threadIdx.x ^ offset) & 31)));
        __syncwarp(0xffffffffu);
    }
    return v;
}

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = warp_max(x[i]);
}
