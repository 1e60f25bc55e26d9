// count[0] += how many elements of x exceed the threshold: each thread counts its grid-stride slice, then adds its
// count to one place with one atomic, the kernel's last statement.
__global__ void kernel(const int* x, int* count, int threshold, int n) {
    int seen = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        if (x[i] > threshold) seen += 1;
    }
    atomicAdd(&count[0], seen);
}
