// Rows of an int matrix sent to the rows an index array names, a row dropped where its mask is off:
// out[dest[r], :] = keep[r] != 0 ? src[r, :] : 0.
__global__ void kernel(const int* __restrict__ src, const int* __restrict__ dest, const int* __restrict__ keep,
                       int* __restrict__ out, int rows, int cols) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (long long)rows * cols) return;
    if (cols % 4 == 0 && i + 3 < (long long)rows * cols && (((size_t)src | (size_t)out) & 15) == 0) {
        int r = i / cols;
        int c = i % cols;
        const int4 src4 = *reinterpret_cast<const int4*>(src + i);
        int4 out4;
        {
            int v = src4.x;
            out4.x = keep[r] != 0 ? v : 0;
        }
        {
            int v = src4.y;
            out4.y = keep[r] != 0 ? v : 0;
        }
        {
            int v = src4.z;
            out4.z = keep[r] != 0 ? v : 0;
        }
        {
            int v = src4.w;
            out4.w = keep[r] != 0 ? v : 0;
        }
        *reinterpret_cast<int4*>(out + ((long long)dest[r] * cols + c)) = out4;
    } else {
        for (long long e = i; e < (long long)rows * cols && e < i + 4; ++e) {
            int r = e / cols;
            int c = e % cols;
            int v = src[e];
            out[(long long)dest[r] * cols + c] = keep[r] != 0 ? v : 0;
        }
    }
}
