// Row softmax, a block a row (serialize_block_reduction's form): three passes over the row, each thread's
// columns strided by the block (256).
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = blockIdx.x;
    const int lane = threadIdx.x;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float m = -INFINITY;
    for (int j = lane; j < n; j += 256) {
        m = fmaxf(m, in[j]);
    }
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    {
        __shared__ float block_m[8];
        if (lane % 32 == 0) block_m[lane / 32] = m;
        __syncthreads();
        m = fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(fmaxf(block_m[0], block_m[1]), block_m[2]), block_m[3]), block_m[4]), block_m[5]), block_m[6]), block_m[7]);
        __syncthreads();
    }
    float s = 0.0f;
    for (int j = lane; j < n; j += 256) {
        s += expf(in[j] - m);
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    {
        __shared__ float block_s[8];
        if (lane % 32 == 0) block_s[lane / 32] = s;
        __syncthreads();
        s = block_s[0] + block_s[1] + block_s[2] + block_s[3] + block_s[4] + block_s[5] + block_s[6] + block_s[7];
        __syncthreads();
    }
    for (int j = lane; j < n; j += 256) {
        y[(long long)row * n + j] = expf(in[j] - m) / s;
    }
}
