// Rows of a matrix added into the rows an index array names (index_add / scatter_add along rows), each element with
// one atomic: out[idx[r], :] += w[r] * src[r, :].
__global__ void kernel(const float* __restrict__ src, const int* __restrict__ idx, const float* __restrict__ w,
                       float* __restrict__ out, int rows, int cols) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (long long)rows * cols) return;
    if (cols % 4 == 0 && i + 3 < (long long)rows * cols && (((size_t)out | (size_t)src) & 15) == 0) {
        int r = i / cols;
        int c = i % cols;
        float4 out4;
        const float4 src4 = *reinterpret_cast<const float4*>(src + i);
        out4.x = w[r] * src4.x;
        out4.y = w[r] * src4.y;
        out4.z = w[r] * src4.z;
        out4.w = w[r] * src4.w;
        atomicAdd(reinterpret_cast<float4*>(out + ((long long)idx[r] * cols + c)), out4);
    } else {
        for (long long e = i; e < (long long)rows * cols && e < i + 4; ++e) {
            int r = e / cols;
            int c = e % cols;
            atomicAdd(&out[(long long)idx[r] * cols + c], w[r] * src[e]);
        }
    }
}
