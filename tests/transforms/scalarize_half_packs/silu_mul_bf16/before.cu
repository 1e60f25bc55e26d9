#include <cuda_bf16.h>

// out = silu(g) * u over bf16 data, and the bf16 gate that was used; one thread per element.
__global__ void kernel(const __nv_bfloat16* __restrict__ g, const __nv_bfloat16* __restrict__ u,
                       __nv_bfloat16* __restrict__ out, __nv_bfloat16* __restrict__ gate, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 7 < n && (((size_t)g | (size_t)u | (size_t)gate | (size_t)out) & 15) == 0) {
        const uint4 g8 = *reinterpret_cast<const uint4*>(g + i);
        const __nv_bfloat16* g8h = reinterpret_cast<const __nv_bfloat16*>(&g8);
        const uint4 u8 = *reinterpret_cast<const uint4*>(u + i);
        const __nv_bfloat16* u8h = reinterpret_cast<const __nv_bfloat16*>(&u8);
        uint4 gate8;
        __nv_bfloat16* gate8h = reinterpret_cast<__nv_bfloat16*>(&gate8);
        uint4 out8;
        __nv_bfloat16* out8h = reinterpret_cast<__nv_bfloat16*>(&out8);
        {
            float v = __bfloat162float(g8h[0]);
            float s = v / (1.0f + expf(-v));
            gate8h[0] = __float2bfloat16(s);
            out8h[0] = __float2bfloat16(s * __bfloat162float(u8h[0]));
        }
        {
            float v = __bfloat162float(g8h[1]);
            float s = v / (1.0f + expf(-v));
            gate8h[1] = __float2bfloat16(s);
            out8h[1] = __float2bfloat16(s * __bfloat162float(u8h[1]));
        }
        {
            float v = __bfloat162float(g8h[2]);
            float s = v / (1.0f + expf(-v));
            gate8h[2] = __float2bfloat16(s);
            out8h[2] = __float2bfloat16(s * __bfloat162float(u8h[2]));
        }
        {
            float v = __bfloat162float(g8h[3]);
            float s = v / (1.0f + expf(-v));
            gate8h[3] = __float2bfloat16(s);
            out8h[3] = __float2bfloat16(s * __bfloat162float(u8h[3]));
        }
        {
            float v = __bfloat162float(g8h[4]);
            float s = v / (1.0f + expf(-v));
            gate8h[4] = __float2bfloat16(s);
            out8h[4] = __float2bfloat16(s * __bfloat162float(u8h[4]));
        }
        {
            float v = __bfloat162float(g8h[5]);
            float s = v / (1.0f + expf(-v));
            gate8h[5] = __float2bfloat16(s);
            out8h[5] = __float2bfloat16(s * __bfloat162float(u8h[5]));
        }
        {
            float v = __bfloat162float(g8h[6]);
            float s = v / (1.0f + expf(-v));
            gate8h[6] = __float2bfloat16(s);
            out8h[6] = __float2bfloat16(s * __bfloat162float(u8h[6]));
        }
        {
            float v = __bfloat162float(g8h[7]);
            float s = v / (1.0f + expf(-v));
            gate8h[7] = __float2bfloat16(s);
            out8h[7] = __float2bfloat16(s * __bfloat162float(u8h[7]));
        }
        *reinterpret_cast<uint4*>(gate + i) = gate8;
        *reinterpret_cast<uint4*>(out + i) = out8;
    } else {
        for (int e = i; e < n && e < i + 8; ++e) {
            float v = __bfloat162float(g[e]);
            float s = v / (1.0f + expf(-v));
            gate[e] = __float2bfloat16(s);
            out[e] = __float2bfloat16(s * __bfloat162float(u[e]));
        }
    }
}
