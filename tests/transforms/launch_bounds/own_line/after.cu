constexpr int THREADS = 128;
constexpr int MIN_BLOCKS = 2;

// The attribute ends the line, and the kernel's name starts the next one.
extern "C" __global__ void
kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
