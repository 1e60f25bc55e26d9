// An integer dot product over a 64-bit index.
__global__ void kernel(const int* a, const int* b, int* out, int n) {
    int acc = 0;
    if ((((size_t)a | (size_t)b) & 15) == 0) {
        for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < n / 4; v += (long long)blockDim.x * gridDim.x) {
            const int4 a4 = reinterpret_cast<const int4*>(a)[v];
            const int4 b4 = reinterpret_cast<const int4*>(b)[v];
            { acc += a4.x * b4.x; }
            { acc += a4.y * b4.y; }
            { acc += a4.z * b4.z; }
            { acc += a4.w * b4.w; }
        }
        for (long long i = (n / 4) * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
            acc += a[i] * b[i];
    } else {
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
            acc += a[i] * b[i];
    }
    atomicAdd(out, acc);
}
