__global__ void concat_last(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                            int rows, int ca, int cb) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * (ca + cb)) {
        const int cols = ca + cb;
        const int r = i / cols, c = i % cols;
        const float v = c < ca ? a[r * ca + c] : b[r * cb + c - ca];
        out[i] = v;
    }
}
