// Leaky ReLU, ITEMS_PER_THREAD consecutive elements per thread; the grid shrinks by the same factor.

constexpr int THREADS = 256;
constexpr int ITEMS_PER_THREAD = 4;  // consecutive elements per thread

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int first = (blockIdx.x * THREADS + threadIdx.x) * ITEMS_PER_THREAD;
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
        const int e = first + i;
        if (e < n) y[e] = x[e] > 0.0f ? x[e] : 0.01f * x[e];
    }
}
