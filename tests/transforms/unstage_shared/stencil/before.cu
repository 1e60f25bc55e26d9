// A 1-D stencil, y[i] = sum over d of w[d] x[i + d - RADIUS] (zero outside [0, n)): each block stages
// its BLOCK outputs' window of x, halo included, with a thread-strided loop.
constexpr int BLOCK = 128;
constexpr int RADIUS = 3;
constexpr int SPAN = BLOCK + 2 * RADIUS;

__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int n)
{
    __shared__ float window[SPAN];
    const int base = blockIdx.x * BLOCK - RADIUS;
    // The window: x[base .. base + SPAN), zeros past either end.
    for (int i = threadIdx.x; i < SPAN; i += BLOCK) {
        const int g = base + i;
        window[i] = (g >= 0 && g < n) ? x[g] : 0.0f;
    }
    __syncthreads();
    const int out = blockIdx.x * BLOCK + threadIdx.x;
    if (out < n) {
        float acc = 0.0f;
        for (int d = 0; d < 2 * RADIUS + 1; ++d)
            acc += w[d] * window[threadIdx.x + d];
        y[out] = acc;
    }
}
