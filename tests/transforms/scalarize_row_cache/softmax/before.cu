// Row softmax, one thread per row: three passes over the row (max, sum of exponentials, store).
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long long)row * n;
    float m = -INFINITY;
    float row_cache[64];
    const bool row_vec4 = n % 4 == 0 && n <= 32 * 64 && ((reinterpret_cast<unsigned long long>(in) | reinterpret_cast<unsigned long long>(y)) & 15) == 0;
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
                        m = fmaxf(m, row_cache[cache_t]);
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
                    m = fmaxf(m, row_cache[cache_t]);
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            m = fmaxf(m, in[j]);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float s = 0.0f;
    if (row_vec4) {
        #pragma unroll
        for (int cache_q = 0; cache_q < 16; ++cache_q) {
            const int cache_j4 = 4 * (lane + 32 * cache_q);
            if (cache_j4 < n) {
                #pragma unroll
                for (int cache_k = 0; cache_k < 4; ++cache_k) {
                    const int cache_t = 4 * cache_q + cache_k;
                    {
                        s += expf(row_cache[cache_t] - m);
                    }
                }
            }
        }
    } else if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                {
                    s += expf(row_cache[cache_t] - m);
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            s += expf(in[j] - m);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (row_vec4) {
        #pragma unroll
        for (int cache_q = 0; cache_q < 16; ++cache_q) {
            const int cache_j4 = 4 * (lane + 32 * cache_q);
            if (cache_j4 < n) {
                float cache_v0[4];
                #pragma unroll
                for (int cache_k = 0; cache_k < 4; ++cache_k) {
                    const int cache_t = 4 * cache_q + cache_k;
                    {
                        cache_v0[cache_k] = expf(row_cache[cache_t] - m) / s;
                    }
                }
                *reinterpret_cast<float4*>(&y[(long long)row * n + cache_j4]) = make_float4(cache_v0[0], cache_v0[1], cache_v0[2], cache_v0[3]);
            }
        }
    } else if (n <= 32 * 64) {
        #pragma unroll
        for (int cache_t = 0; cache_t < 64; ++cache_t) {
            const int j = lane + 32 * cache_t;
            if (j < n) {
                {
                    y[(long long)row * n + j] = expf(row_cache[cache_t] - m) / s;
                }
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) {
            y[(long long)row * n + j] = expf(in[j] - m) / s;
        }
    }
}
