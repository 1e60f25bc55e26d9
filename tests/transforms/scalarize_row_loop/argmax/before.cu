// Weighted row argmax, one thread per row: the row's largest x[j] * w[j] and the first column that holds it.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ peak,
                       long long* __restrict__ where, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float top = in[0] * w[0];
    long long top_at = 0;
    if (n % 4 == 0 && ((reinterpret_cast<unsigned long long>(in) | reinterpret_cast<unsigned long long>(w)) & 15) == 0) {
        for (int j = 1 + lane; j < 4 && j < n; j += 32) {
            const float v = in[j] * w[j];
            if (v > top) {
                top = v;
                top_at = j;
            }
        }
        for (int row_j4 = 4 + 4 * lane; row_j4 < n; row_j4 += 128) {
            const float4 row_r0 = __ldg(reinterpret_cast<const float4*>(&in[row_j4]));
            const float row_v0[4] = {row_r0.x, row_r0.y, row_r0.z, row_r0.w};
            const float4 row_r1 = __ldg(reinterpret_cast<const float4*>(&w[row_j4]));
            const float row_v1[4] = {row_r1.x, row_r1.y, row_r1.z, row_r1.w};
            #pragma unroll
            for (int row_k = 0; row_k < 4; ++row_k) {
                const int j = row_j4 + row_k;
                const float v = row_v0[row_k] * row_v1[row_k];
                if (v > top) {
                    top = v;
                    top_at = j;
                }
            }
        }
    } else {
        for (int j = 1 + lane; j < n; j += 32) {
            const float v = in[j] * w[j];
            if (v > top) {
                top = v;
                top_at = j;
            }
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float pair_value = __shfl_xor_sync(0xffffffffu, top, offset);
        const long long pair_index = __shfl_xor_sync(0xffffffffu, top_at, offset);
        if (pair_value > top || (pair_value == top && pair_index < top_at)) {
            top = pair_value;
            top_at = pair_index;
        }
    }
    peak[row] = top;
    where[row] = top_at;
}
