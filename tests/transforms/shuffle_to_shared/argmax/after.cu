// Warp argmax of (value, index) pairs: two shuffled values of two types per step (reference
// parameters), ties broken by the lower index; every lane ends with the warp's winner.
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ void warp_argmax(float& value, int& index)
{
    __shared__ float shfl_scratch0[32][32];  // shuffle_to_shared scratch: a 32-slot row per warp
    float* const shfl_row0 = shfl_scratch0[threadIdx.x >> 5];
    __shared__ int shfl_scratch0_1[32][32];  // shuffle_to_shared scratch: a 32-slot row per warp
    int* const shfl_row0_1 = shfl_scratch0_1[threadIdx.x >> 5];
    const int shfl_lane0 = threadIdx.x & 31;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        shfl_row0[shfl_lane0] = value;
        __syncwarp(FULL);
        const float other_value = *(shfl_row0 + ((threadIdx.x ^ offset) & 31));
        __syncwarp(FULL);
        shfl_row0_1[shfl_lane0] = index;
        __syncwarp(FULL);
        const int other_index = *(shfl_row0_1 + ((threadIdx.x ^ offset) & 31));
        __syncwarp(FULL);
        if (other_value > value || (other_value == value && other_index < index)) {
            value = other_value;
            index = other_index;
        }
    }
}

extern "C" __global__ void kernel(const float* __restrict__ x, int* __restrict__ out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float value = x[i];
    int index = i;
    warp_argmax(value, index);
    if ((threadIdx.x & 31) == 0) out[i / 32] = index;
}
