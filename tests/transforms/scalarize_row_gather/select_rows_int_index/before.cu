// index_select over rows with a 32-bit element index: out[r, :] = table[idx[r], :]. Four elements per thread
// would need i * 4, which may wrap in 32 bits where i did not, so the forward widens the index to 64 bits.
__global__ void kernel(const float* __restrict__ table, const int* __restrict__ idx, float* __restrict__ out,
                       int rows, int cols) {
    long long i = (long long)(blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i < rows * cols) {
        if (cols % 4 == 0 && i + 3 < rows * cols && (((size_t)table | (size_t)out) & 15) == 0) {
            int r = i / cols, c = i % cols;
            const float4 table4 = *reinterpret_cast<const float4*>(table + ((long long)idx[r] * cols + c));
            float4 out4;
            out4.x = table4.x;
            out4.y = table4.y;
            out4.z = table4.z;
            out4.w = table4.w;
            *reinterpret_cast<float4*>(out + i) = out4;
        } else {
            for (long long e = i; e < rows * cols && e < i + 4; ++e) {
                int r = e / cols, c = e % cols;
                out[e] = table[(long long)idx[r] * cols + c];
            }
        }
    }
}
