constexpr int ITEMS = 16;

// Each thread scales ITEMS strided elements; the pragma sits in column 0, as some experts write it.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, float scale, int n)
{
    const int base = blockIdx.x * blockDim.x * ITEMS + threadIdx.x;
    for (int k = 0; k < 2; ++k) y[0] += 0.0f * k;  // a first loop over k: the anchor's ordinal skips it
#pragma unroll 4
    for (int k = 0; k < ITEMS; ++k) {
        const int i = base + k * blockDim.x;
        if (i < n) y[i] = x[i] * scale;
    }
}
