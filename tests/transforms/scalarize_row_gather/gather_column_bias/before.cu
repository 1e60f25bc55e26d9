// A gather plus a bias shared by every row (a position embedding): the row through the index, the bias at the column
// alone (a column broadcast); both are 16-byte packs where cols divides by four.
__global__ void kernel(const float* __restrict__ table, const int* __restrict__ idx, const float* __restrict__ bias,
                       float* __restrict__ out, int rows, int cols) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (long long)rows * cols) return;
    if (cols % 4 == 0 && i + 3 < (long long)rows * cols && (((size_t)table | (size_t)bias | (size_t)out) & 15) == 0) {
        int r = i / cols, c = i % cols;
        const float4 table4 = *reinterpret_cast<const float4*>(table + ((long long)idx[r] * cols + c));
        const float4 bias4 = *reinterpret_cast<const float4*>(bias + c);
        float4 out4;
        out4.x = table4.x + bias4.x;
        out4.y = table4.y + bias4.y;
        out4.z = table4.z + bias4.z;
        out4.w = table4.w + bias4.w;
        *reinterpret_cast<float4*>(out + i) = out4;
    } else {
        for (long long e = i; e < (long long)rows * cols && e < i + 4; ++e) {
            int r = e / cols, c = e % cols;
            out[e] = table[(long long)idx[r] * cols + c] + bias[c];
        }
    }
}
