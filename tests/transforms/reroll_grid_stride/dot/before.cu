// Dot product written for reroll_grid_stride's tests: each thread sums a grid-stride slice of float4 pairs (the
// vectors counted by the caller), then the scalar tail; a warp adds its threads' sums and one lane adds the total.
__global__ void kernel(const float4* __restrict__ x, const float4* __restrict__ y, const float* __restrict__ xs,
                       const float* __restrict__ ys, float* __restrict__ out, int vectors, int n) {
    float s = 0.0f;
    for (int v_base = blockIdx.x * blockDim.x + threadIdx.x; v_base < vectors; v_base += 2 * (blockDim.x * gridDim.x)) {
        if (v_base + 1 * (blockDim.x * gridDim.x) < vectors) {
#pragma unroll
            for (int v_step = 0; v_step < 2; ++v_step) {
                const int v = v_base + v_step * (blockDim.x * gridDim.x);
                {
                    const float4 a = x[v], b = y[v];
                    s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
            }
        } else {
#pragma unroll
            for (int v_step = 0; v_step < 2; ++v_step) {
                const int v = v_base + v_step * (blockDim.x * gridDim.x);
                if (v < vectors) {
                    const float4 a = x[v], b = y[v];
                    s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
            }
        }
    }
    for (int i_base = vectors * 4 + blockIdx.x * blockDim.x + threadIdx.x; i_base < n; i_base += 2 * (blockDim.x * gridDim.x)) {
        if (i_base + 1 * (blockDim.x * gridDim.x) < n) {
#pragma unroll
            for (int i_step = 0; i_step < 2; ++i_step) {
                const int i = i_base + i_step * (blockDim.x * gridDim.x);
                s += xs[i] * ys[i];
            }
        } else {
#pragma unroll
            for (int i_step = 0; i_step < 2; ++i_step) {
                const int i = i_base + i_step * (blockDim.x * gridDim.x);
                if (i < n) s += xs[i] * ys[i];
            }
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (threadIdx.x % 32 == 0) atomicAdd(out, s);
}
