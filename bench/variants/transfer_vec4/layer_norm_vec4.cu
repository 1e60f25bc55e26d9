// The library's layer_norm kernel (bench/transfer, library_then_catalog) with its register row cache filled and
// its row written 16 bytes a lane at a time where the row allows it (cols % 4 == 0, fits, 16-byte aligned).
#include <cstdint>
__global__ void __launch_bounds__(128) layer_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                           float* __restrict__ y, int rows, int cols) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * cols;
    float sum = 0.0f;
    const bool vec = cols % 4 == 0 && cols <= 32 * 64 &&
                     ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(b) |
                       reinterpret_cast<uintptr_t>(y)) & 15) == 0;
    if (vec) {
        float4 cache4[16];
        #pragma unroll
        for (int t = 0; t < 16; ++t) {
            const int j4 = lane + 32 * t;
            if (4 * j4 < cols) {
                cache4[t] = __ldg(reinterpret_cast<const float4*>(in) + j4);
                sum += cache4[t].x + cache4[t].y + cache4[t].z + cache4[t].w;
            }
        }
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        const float mean = sum / cols;
        float squares = 0.0f;
        #pragma unroll
        for (int t = 0; t < 16; ++t) {
            if (4 * (lane + 32 * t) < cols) {
                const float a = cache4[t].x - mean, c = cache4[t].y - mean, d = cache4[t].z - mean, e = cache4[t].w - mean;
                squares += a * a + c * c + d * d + e * e;
            }
        }
        for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
        const float rstd = rsqrtf(squares / cols + 1e-5f);
        float4* out = reinterpret_cast<float4*>(y + (long long)row * cols);
        #pragma unroll
        for (int t = 0; t < 16; ++t) {
            const int j4 = lane + 32 * t;
            if (4 * j4 < cols) {
                const float4 wv = __ldg(reinterpret_cast<const float4*>(w) + j4);
                const float4 bv = __ldg(reinterpret_cast<const float4*>(b) + j4);
                out[j4] = make_float4((cache4[t].x - mean) * rstd * wv.x + bv.x, (cache4[t].y - mean) * rstd * wv.y + bv.y,
                                      (cache4[t].z - mean) * rstd * wv.z + bv.z, (cache4[t].w - mean) * rstd * wv.w + bv.w);
            }
        }
        return;
    }
    float row_cache[64];
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                row_cache[cache_t] = in[j];
                sum += row_cache[cache_t];
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) sum += __ldg(&in[j]);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    float mean = sum / cols;
    float squares = 0.0f;
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                {
                    float d = row_cache[cache_t] - mean;
                    squares += d * d;
                }
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) {
            float d = __ldg(&in[j]) - mean;
            squares += d * d;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    float rstd = rsqrtf(squares / cols + 1e-5f);
    if (cols <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < cols) {
                y[(long long)row * cols + j] = (row_cache[cache_t] - mean) * rstd * __ldg(&w[j]) + __ldg(&b[j]);
            }
        }
    } else {
        for (int j = lane; j < cols; j += 32) y[(long long)row * cols + j] = (__ldg(&in[j]) - mean) * rstd * __ldg(&w[j]) + __ldg(&b[j]);
    }
}
