// Weighted rows, a warp per row: each row scaled column by column by a weight vector into y, and its weighted
// sum into total.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                       float* __restrict__ total, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float acc = 0.0f;
    if (n % 4 == 0 && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w) | reinterpret_cast<unsigned long long>(y)) & 15) == 0) {
        for (int row_j4 = 4 * lane; row_j4 < n; row_j4 += 128) {
            const float4 row_r0 = __ldg(reinterpret_cast<const float4*>(&x[(long long)row * n + row_j4]));
            const float row_v0[4] = {row_r0.x, row_r0.y, row_r0.z, row_r0.w};
            const float4 row_r1 = __ldg(reinterpret_cast<const float4*>(&w[row_j4]));
            const float row_v1[4] = {row_r1.x, row_r1.y, row_r1.z, row_r1.w};
            float row_v2[4];
            #pragma unroll
            for (int row_k = 0; row_k < 4; ++row_k) {
                const float v = row_v0[row_k] * row_v1[row_k];
                row_v2[row_k] = v;
                acc += v;
            }
            *reinterpret_cast<float4*>(&y[(long long)row * n + row_j4]) = make_float4(row_v2[0], row_v2[1], row_v2[2], row_v2[3]);
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            const float v = x[(long long)row * n + j] * w[j];
            y[(long long)row * n + j] = v;
            acc += v;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) total[row] = acc;
}
