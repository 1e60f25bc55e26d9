// An integer dot product over a 64-bit index.
__global__ void kernel(const int* a, const int* b, int* out, int n) {
    int acc = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
        acc += a[i] * b[i];
    atomicAdd(out, acc);
}
