// SGD with Nesterov momentum, tuned for a memory-bound GPU: a grid-stride loop over float4 vectors
// with a grid sized to the GPU (BLOCKS_PER_SM blocks per SM), UNROLL vectors of each of the three
// inputs in flight per thread, float4 stores, and the n % 4 tail handled by the first threads.
// The buffers are 256-byte aligned, so vector i of every array is 16-byte aligned.

constexpr int THREADS = 256;
constexpr int BLOCKS_PER_SM = 8;       // grid = num_sms * BLOCKS_PER_SM, capped by the work
static_assert(BLOCKS_PER_SM > 0, "the launch plan sizes the grid as num_sms * BLOCKS_PER_SM blocks");
constexpr int UNROLL = 2;              // float4 steps in flight per thread
constexpr float LR = 0.01f;
constexpr float MOMENTUM = 0.9f;
constexpr float WEIGHT_DECAY = 1e-4f;

// One element of the step: (p, g, buf) -> (p_new, buf_new).
__device__ __forceinline__ void step(float p, float g, float buf, float& p_out, float& buf_out)
{
    const float d = fmaf(WEIGHT_DECAY, p, g);
    buf_out = fmaf(MOMENTUM, buf, d);
    p_out = fmaf(-LR, fmaf(MOMENTUM, buf_out, d), p);
}

__device__ __forceinline__ void step4(const float4& p, const float4& g, const float4& b, float4& po, float4& bo)
{
    step(p.x, g.x, b.x, po.x, bo.x);
    step(p.y, g.y, b.y, po.y, bo.y);
    step(p.z, g.z, b.z, po.z, bo.z);
    step(p.w, g.w, b.w, po.w, bo.w);
}

extern "C" __global__ void __launch_bounds__(THREADS)
sgd_nesterov_vec4_grid(const float* __restrict__ p, const float* __restrict__ g, const float* __restrict__ buf,
                       float* __restrict__ p_new, float* __restrict__ buf_new, int n)
{
    const int vectors = n / 4;
    const int stride = gridDim.x * THREADS;
    const int first = blockIdx.x * THREADS + threadIdx.x;
    const float4* __restrict__ p4 = reinterpret_cast<const float4*>(p);
    const float4* __restrict__ g4 = reinterpret_cast<const float4*>(g);
    const float4* __restrict__ b4 = reinterpret_cast<const float4*>(buf);
    float4* __restrict__ po4 = reinterpret_cast<float4*>(p_new);
    float4* __restrict__ bo4 = reinterpret_cast<float4*>(buf_new);

    for (int base = first; base < vectors; base += stride * UNROLL) {
        float4 pv[UNROLL], gv[UNROLL], bv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * stride;
            if (i < vectors) {
                pv[u] = __ldg(p4 + i);
                gv[u] = __ldg(g4 + i);
                bv[u] = __ldg(b4 + i);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * stride;
            if (i < vectors) {
                float4 po, bo;
                step4(pv[u], gv[u], bv[u], po, bo);
                po4[i] = po;
                bo4[i] = bo;
            }
        }
    }
    // The tail: at most three elements past the last whole vector.
    const int i = vectors * 4 + first;
    if (i < n) step(__ldg(p + i), __ldg(g + i), __ldg(buf + i), p_new[i], buf_new[i]);
}
