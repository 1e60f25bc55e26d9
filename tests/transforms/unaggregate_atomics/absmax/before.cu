// out[0] = the largest |x| as the int of its bits (non-negative floats order as their bits do), a quantization
// scale's absolute maximum: one atomicMax per element.
__global__ void kernel(const float* x, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int warp_max = (-2147483647 - 1);
    if (i < n) warp_max = max(warp_max, (int)(__float_as_int(fabsf(x[i]))));
    for (int offset = 16; offset > 0; offset /= 2) warp_max = max(warp_max, __shfl_xor_sync(0xffffffffu, warp_max, offset));
    if (threadIdx.x % 32 == 0) atomicMax(out, warp_max);
}
