// out += the mean squared difference of a and b (out zeroed by the caller): one thread per element, each adding
// its share to one float with an atomic.
__global__ void kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float warp_total = 0;
    if (i < n) {
        float d = a[i] - b[i];
        warp_total += d * d / n;
    }
    for (int offset = 16; offset > 0; offset /= 2) warp_total += __shfl_xor_sync(0xffffffffu, warp_total, offset);
    if (threadIdx.x % 32 == 0) atomicAdd(out, warp_total);
}
