// Row argmax, a warp per row, column 0 taken as the start: the lanes walk columns 1 + lane, 33 + lane, ...,
// keep the first largest they see, and the butterfly keeps the smaller column on ties.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ value, long long* __restrict__ index,
                       int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float best = __ldg(&in[0]);
    long long at = 0;
    if (n % 4 == 0 && ((reinterpret_cast<unsigned long long>(in)) & 15) == 0) {
        for (int w_j4 = 4 * lane; w_j4 < n; w_j4 += 128) {
            const float4 w_r0 = __ldg(reinterpret_cast<const float4*>(&in[w_j4]));
            const float w_v0[4] = {w_r0.x, w_r0.y, w_r0.z, w_r0.w};
            #pragma unroll
            for (int w_k = 0; w_k < 4; ++w_k) {
                if (w_j4 + w_k < 1) continue;
                const int j = w_j4 + w_k;
                if (w_v0[w_k] > best) {
                    best = w_v0[w_k];
                    at = j;
                }
            }
        }
    } else {
        for (int j = 1 + lane; j < n; j += 32) {
            if (__ldg(&in[j]) > best) {
                best = __ldg(&in[j]);
                at = j;
            }
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float pair_value = __shfl_xor_sync(0xffffffffu, best, offset);
        const long long pair_index = __shfl_xor_sync(0xffffffffu, at, offset);
        if (pair_value > best || (pair_value == best && pair_index < at)) {
            best = pair_value;
            at = pair_index;
        }
    }
    if (lane == 0) {
        value[row] = best;
        index[row] = at;
    }
}
