// Warp sum by an xor butterfly: every lane ends with the sum of its warp's 32 values.
__device__ __forceinline__ float warp_sum(float v)
{
    __shared__ float shfl_scratch0[32][32];  // shuffle_to_shared scratch: a 32-slot row per warp
    float* const shfl_row0 = shfl_scratch0[threadIdx.x >> 5];
    const int shfl_lane0 = threadIdx.x & 31;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        shfl_row0[shfl_lane0] = v;
        __syncwarp(0xffffffffu);
        v += *(shfl_row0 + ((threadIdx.x ^ offset) & 31));
        __syncwarp(0xffffffffu);
    }
    return v;
}

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = warp_sum(x[i]);
}
