// Rotary embedding, the plain way: one thread per output element. Each thread reads its element,
// its partner in the other half of the head, and the angle's cos and sin, all as scalars.

#include <cuda_bf16.h>

constexpr int THREADS = 256;

extern "C" __global__ void __launch_bounds__(THREADS)
rope_naive(const __nv_bfloat16* x, const float* cos_t, const float* sin_t, __nv_bfloat16* y,
           int b, int s, int h, int d)
{
    const size_t total = static_cast<size_t>(b) * s * h * d;
    const size_t i = static_cast<size_t>(blockIdx.x) * THREADS + threadIdx.x;
    if (i >= total) return;
    const int half = d / 2;
    const int k = static_cast<int>(i % d);
    const size_t row = i / d;                       // (batch, token, head)
    const int token = static_cast<int>((row / h) % s);
    const size_t start = row * d;
    const int f = k < half ? k : k - half;          // the frequency index
    const float c = cos_t[static_cast<size_t>(token) * half + f];
    const float sn = sin_t[static_cast<size_t>(token) * half + f];
    const float x1 = __bfloat162float(x[start + f]);
    const float x2 = __bfloat162float(x[start + f + half]);
    y[i] = __float2bfloat16(k < half ? x1 * c - x2 * sn : x2 * c + x1 * sn);
}
