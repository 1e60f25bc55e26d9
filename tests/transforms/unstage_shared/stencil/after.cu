// A 1-D stencil, y[i] = sum over d of w[d] x[i + d - RADIUS] (zero outside [0, n)): each block stages
// its BLOCK outputs' window of x, halo included, with a thread-strided loop.
constexpr int BLOCK = 128;
constexpr int RADIUS = 3;
constexpr int SPAN = BLOCK + 2 * RADIUS;

__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int n)
{
    const int base = blockIdx.x * BLOCK - RADIUS;
    const int out = blockIdx.x * BLOCK + threadIdx.x;
    if (out < n) {
        float acc = 0.0f;
        for (int d = 0; d < 2 * RADIUS + 1; ++d)
            acc += w[d] * (((base + (threadIdx.x + d)) >= 0 && (base + (threadIdx.x + d)) < n) ? x[base + (threadIdx.x + d)] : 0.0f);
        y[out] = acc;
    }
}
