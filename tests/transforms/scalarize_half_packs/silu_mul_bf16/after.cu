#include <cuda_bf16.h>

// out = silu(g) * u over bf16 data, and the bf16 gate that was used; one thread per element.
__global__ void kernel(const __nv_bfloat16* __restrict__ g, const __nv_bfloat16* __restrict__ u,
                       __nv_bfloat16* __restrict__ out, __nv_bfloat16* __restrict__ gate, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __bfloat162float(g[i]);
        float s = v / (1.0f + expf(-v));
        gate[i] = __float2bfloat16(s);
        out[i] = __float2bfloat16(s * __bfloat162float(u[i]));
    }
}
