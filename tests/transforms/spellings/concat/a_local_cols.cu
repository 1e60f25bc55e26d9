__global__ void concat_last(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                            int rows, int ca, int cb) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int cols = ca + cb;
    if (i >= rows * cols) return;
    int r = i / cols, c = i % cols;
    out[i] = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
}
