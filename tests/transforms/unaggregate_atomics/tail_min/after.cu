// out[0] = the least index whose element exceeds the threshold (n where none does): each thread finds the least of
// its grid-stride slice, then makes one atomicMin, the kernel's last statement.
__global__ void kernel(const float* x, long long* out, float threshold, int n) {
    long long first = n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        if (x[i] > threshold && i < first) first = i;
    }
    atomicMin(out, first);
}
