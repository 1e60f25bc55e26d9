__global__ void concat_last(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                            int rows, int ca, int cb) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int cols = ca + cb;
    const int r = i / cols;
    const int c = i - r * cols;
    if (i >= rows * cols) return;
    out[i] = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
}
