// Concatenation along the last dim, out[r, :] = [a[r, :], b[r, :]], one thread per output element; the row
// length a local between the index and the guard, the guard's bound a product of it.
__global__ void kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                       int rows, int ca, int cb) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    const int cols = ca + cb;
    if (i + 3 < rows * cols && (((size_t)out) & 15) == 0) {
        float4 out4;
        {
            int r = i / cols, c = i % cols;
            out4.x = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
        }
        {
            int r = (i + 1) / cols, c = (i + 1) % cols;
            out4.y = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
        }
        {
            int r = (i + 2) / cols, c = (i + 2) % cols;
            out4.z = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
        }
        {
            int r = (i + 3) / cols, c = (i + 3) % cols;
            out4.w = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
        }
        *reinterpret_cast<float4*>(out + i) = out4;
    } else {
        for (int e = i; e < rows * cols && e < i + 4; ++e) {
            int r = e / cols, c = e % cols;
            out[e] = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
        }
    }
}
