// out[0] = the least index whose element exceeds the threshold (n where none does): each thread finds the least of
// its grid-stride slice, then makes one atomicMin, the kernel's last statement.
__global__ void kernel(const float* x, long long* out, float threshold, int n) {
    long long first = n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        if (x[i] > threshold && i < first) first = i;
    }
    long long warp_min = first;
    for (int offset = 16; offset > 0; offset /= 2) warp_min = min(warp_min, __shfl_xor_sync(0xffffffffu, warp_min, offset));
    if (threadIdx.x % 32 == 0) atomicMin(out, warp_min);
}
