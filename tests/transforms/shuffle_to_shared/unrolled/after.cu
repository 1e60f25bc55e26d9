// Warp sum of integers, the butterfly written out by hand (constant offsets, no loop).
__device__ __forceinline__ int warp_sum_int(int v)
{
    __shared__ int shfl_scratch0[32][32];  // shuffle_to_shared scratch: a 32-slot row per warp
    int* const shfl_row0 = shfl_scratch0[threadIdx.x >> 5];
    const int shfl_lane0 = threadIdx.x & 31;
    shfl_row0[shfl_lane0] = v;
    __syncwarp(0xffffffffu);
    v += *(shfl_row0 + ((threadIdx.x ^ 16) & 31));
    __syncwarp(0xffffffffu);
    shfl_row0[shfl_lane0] = v;
    __syncwarp(0xffffffffu);
    v += *(shfl_row0 + ((threadIdx.x ^ 8) & 31));
    __syncwarp(0xffffffffu);
    shfl_row0[shfl_lane0] = v;
    __syncwarp(0xffffffffu);
    v += *(shfl_row0 + ((threadIdx.x ^ 4) & 31));
    __syncwarp(0xffffffffu);
    shfl_row0[shfl_lane0] = v;
    __syncwarp(0xffffffffu);
    v += *(shfl_row0 + ((threadIdx.x ^ 2) & 31));
    __syncwarp(0xffffffffu);
    shfl_row0[shfl_lane0] = v;
    __syncwarp(0xffffffffu);
    v += *(shfl_row0 + ((threadIdx.x ^ 1) & 31));
    __syncwarp(0xffffffffu);
    return v;
}

extern "C" __global__ void kernel(const int* __restrict__ x, int* __restrict__ out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = warp_sum_int(x[i]);
}
