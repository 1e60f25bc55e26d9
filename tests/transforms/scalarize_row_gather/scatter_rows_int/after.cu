// Rows of an int matrix sent to the rows an index array names, a row dropped where its mask is off:
// out[dest[r], :] = keep[r] != 0 ? src[r, :] : 0.
__global__ void kernel(const int* __restrict__ src, const int* __restrict__ dest, const int* __restrict__ keep,
                       int* __restrict__ out, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = i / cols;
    int c = i % cols;
    int v = src[i];
    out[(long long)dest[r] * cols + c] = keep[r] != 0 ? v : 0;
}
