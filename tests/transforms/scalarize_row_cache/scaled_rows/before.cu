// Scaled row norm, one thread per row: the row's mean absolute value, then each column scaled by a
// per-column gain and written into a padded output whose row pitch is its own argument.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ gain, float* __restrict__ y,
                       int rows, int n, int pitch) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float total = 0.0f;
    float row_cache[64];
    const bool row_vec4 = n % 4 == 0 && n <= 32 * 64 && ((reinterpret_cast<unsigned long long>(in) | reinterpret_cast<unsigned long long>(y) | reinterpret_cast<unsigned long long>(gain)) & 15) == 0 && ((long long)row * pitch) % 4 == 0;
    if (row_vec4) {
        #pragma unroll
        for (int cache_q = 0; cache_q < 16; ++cache_q) {
            const int cache_j4 = 4 * (lane + 32 * cache_q);
            if (cache_j4 < n) {
                const float4 cache_r0 = __ldg(reinterpret_cast<const float4*>(&in[cache_j4]));
                const float cache_v0[4] = {cache_r0.x, cache_r0.y, cache_r0.z, cache_r0.w};
                #pragma unroll
                for (int cache_k = 0; cache_k < 4; ++cache_k) {
                    const int cache_t = 4 * cache_q + cache_k;
                    row_cache[cache_t] = cache_v0[cache_k];
                    {
                        total += fabsf(row_cache[cache_t]);
                    }
                }
            }
        }
    } else if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                row_cache[cache_t] = in[j];
                {
                    total += fabsf(row_cache[cache_t]);
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            total += fabsf(in[j]);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
    const float inv = n > 0 ? n / fmaxf(total, 1e-20f) : 0.0f;
    if (row_vec4) {
        #pragma unroll
        for (int cache_q = 0; cache_q < 16; ++cache_q) {
            const int cache_j4 = 4 * (lane + 32 * cache_q);
            if (cache_j4 < n) {
                float cache_v0[4];
                const float4 cache_r1 = __ldg(reinterpret_cast<const float4*>(&gain[cache_j4]));
                const float cache_v1[4] = {cache_r1.x, cache_r1.y, cache_r1.z, cache_r1.w};
                #pragma unroll
                for (int cache_k = 0; cache_k < 4; ++cache_k) {
                    const int cache_t = 4 * cache_q + cache_k;
                    {
                        cache_v0[cache_k] = row_cache[cache_t] * inv * cache_v1[cache_k];
                    }
                }
                *reinterpret_cast<float4*>(&y[(long long)row * pitch + cache_j4]) = make_float4(cache_v0[0], cache_v0[1], cache_v0[2], cache_v0[3]);
            }
        }
    } else if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                {
                    y[(long long)row * pitch + j] = row_cache[cache_t] * inv * gain[j];
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            y[(long long)row * pitch + j] = in[j] * inv * gain[j];
        }
    }
}
