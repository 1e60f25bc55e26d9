// Batched row dot products, a warp per row: each lane strides the row by 32 columns, then the lanes' sums are
// combined by a butterfly. The weight vector is shared by every row.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                       int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float acc = 0.0f;
    if (n % 4 == 0 && ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w)) & 15) == 0) {
        for (int w_j4 = 4 * lane; w_j4 < n; w_j4 += 128) {
            const float4 w_r0 = __ldg(reinterpret_cast<const float4*>(&x[(long long)row * n + w_j4]));
            const float w_v0[4] = {w_r0.x, w_r0.y, w_r0.z, w_r0.w};
            const float4 w_r1 = __ldg(reinterpret_cast<const float4*>(&w[w_j4]));
            const float w_v1[4] = {w_r1.x, w_r1.y, w_r1.z, w_r1.w};
            #pragma unroll
            for (int w_k = 0; w_k < 4; ++w_k) {
                acc += w_v0[w_k] * w_v1[w_k];
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            acc += x[(long long)row * n + j] * w[j];
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) y[row] = acc;
}
