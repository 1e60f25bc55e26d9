// A bias add, GELU and a per-channel scale, one thread per element of a rows x cols matrix: bias[c] and scale[c]
// are read by every row (column broadcasts).
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ bias, const float* __restrict__ scale,
                       float* __restrict__ out, int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int c = i % cols;
        float v = x[i] + bias[c];
        out[i] = 0.5f * v * (1.0f + erff(v * 0.70710678f)) * scale[c];
    }
}
