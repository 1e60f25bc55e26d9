// count[0] += how many elements of x exceed the threshold: a grid-stride loop that makes one atomic per element it
// counts.
__global__ void kernel(const int* x, int* count, int threshold, int n) {
    int warp_total = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        if (x[i] > threshold) warp_total += 1;
    }
    for (int offset = 16; offset > 0; offset /= 2) warp_total += __shfl_xor_sync(0xffffffffu, warp_total, offset);
    if (threadIdx.x % 32 == 0) atomicAdd(count, warp_total);
}
