// Warp argmax of (value, index) pairs: two shuffled values of two types per step (reference
// parameters), ties broken by the lower index; every lane ends with the warp's winner.
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ void warp_argmax(float& value, int& index)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_value = __shfl_xor_sync(FULL, value, offset);
        const int other_index = __shfl_xor_sync(FULL, index, offset);
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
