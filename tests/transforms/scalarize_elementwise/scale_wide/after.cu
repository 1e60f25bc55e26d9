// y = a * x + b, one thread per element, a 64-bit element index (n past 2^31 elements).
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float a, float b, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
