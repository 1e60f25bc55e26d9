// Gated delta rule, token-by-token recurrence: the naive end of the GDN corpus.
//
// One CTA per (batch, value head). The state S [DK x DV] (fp32) lives in registers: thread
// (column j, row slice r) owns S[r + ROW_SPLIT * i][j] for i < ROWS_PER_THREAD, so the ROW_SPLIT
// threads of one column sit in adjacent lanes of one warp and reduce with shuffles. Per token:
//     S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = scale S^T q
// (FLA's naive_recurrent_gated_delta_rule). Value head h reads q/k head h / (HV / H) (GVA).
// q, k, v, g, beta of TOKENS_PER_TILE tokens are staged in shared memory (fp32) once per tile.
#include <cuda_bf16.h>
#include <stdint.h>

constexpr int MAX_DK = 128;            // the state's rows held per CTA (DK <= MAX_DK)
constexpr int MAX_DV = 128;            // the state's columns held per CTA (DV <= MAX_DV)
constexpr int ROW_SPLIT = 4;           // threads sharing one column of S (adjacent lanes)
constexpr int ROWS_PER_THREAD = MAX_DK / ROW_SPLIT;
constexpr int THREADS = MAX_DV * ROW_SPLIT;
constexpr int TOKENS_PER_TILE = 16;    // tokens staged in shared memory per barrier pair
constexpr int SMEM_FLOATS = TOKENS_PER_TILE * (2 * MAX_DK + MAX_DV + 2);
constexpr int SMEM_BYTES = SMEM_FLOATS * 4;

static_assert(32 % ROW_SPLIT == 0, "a column's threads must share a warp");
static_assert(MAX_DK % ROW_SPLIT == 0, "rows split evenly");

// ---- staging: one tile of tokens into shared memory, as fp32, zero past the end ----------------
__device__ __forceinline__ void stage_tile(float* q_s, float* k_s, float* v_s, float* decay_s, float* beta_s,
                                           const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                           const __nv_bfloat16* __restrict__ v, const float* __restrict__ g,
                                           const __nv_bfloat16* __restrict__ beta, int b, int hv, int hq, int t0,
                                           int T, int H, int HV, int DK, int DV) {
    for (int idx = threadIdx.x; idx < TOKENS_PER_TILE * MAX_DK; idx += THREADS) {
        const int tt = idx / MAX_DK, d = idx % MAX_DK, t = t0 + tt;
        float qv = 0.f, kv = 0.f;
        if (t < T && d < DK) {
            const int64_t off = ((int64_t)(b * T + t) * H + hq) * DK + d;
            qv = __bfloat162float(q[off]);
            kv = __bfloat162float(k[off]);
        }
        q_s[idx] = qv;
        k_s[idx] = kv;
    }
    for (int idx = threadIdx.x; idx < TOKENS_PER_TILE * MAX_DV; idx += THREADS) {
        const int tt = idx / MAX_DV, d = idx % MAX_DV, t = t0 + tt;
        float vv = 0.f;
        if (t < T && d < DV) vv = __bfloat162float(v[((int64_t)(b * T + t) * HV + hv) * DV + d]);
        v_s[idx] = vv;
    }
    if (threadIdx.x < TOKENS_PER_TILE) {
        const int t = t0 + threadIdx.x;
        float a = 1.f, be = 0.f;
        if (t < T) {
            const int64_t off = (int64_t)(b * T + t) * HV + hv;
            a = expf(g[off]);
            be = __bfloat162float(beta[off]);
        }
        decay_s[threadIdx.x] = a;
        beta_s[threadIdx.x] = be;
    }
}

// ---- the sum over a column's ROW_SPLIT threads (adjacent lanes) --------------------------------
__device__ __forceinline__ float column_sum(float x) {
#pragma unroll
    for (int m = 1; m < ROW_SPLIT; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gdn_recurrent(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
              const __nv_bfloat16* __restrict__ v, const float* __restrict__ g,
              const __nv_bfloat16* __restrict__ beta, __nv_bfloat16* __restrict__ o,
              int B, int T, int H, int HV, int DK, int DV) {
    extern __shared__ float smem[];
    float* q_s = smem;                                  // [TOKENS_PER_TILE][MAX_DK]
    float* k_s = q_s + TOKENS_PER_TILE * MAX_DK;        // [TOKENS_PER_TILE][MAX_DK]
    float* v_s = k_s + TOKENS_PER_TILE * MAX_DK;        // [TOKENS_PER_TILE][MAX_DV]
    float* decay_s = v_s + TOKENS_PER_TILE * MAX_DV;    // [TOKENS_PER_TILE] exp(g)
    float* beta_s = decay_s + TOKENS_PER_TILE;          // [TOKENS_PER_TILE]

    const int b = blockIdx.x / HV, hv = blockIdx.x % HV;
    const int hq = hv / (HV / H);                       // GVA: FLA's i_h // (HV // H)
    const int col = threadIdx.x / ROW_SPLIT;            // the column j of S this thread holds
    const int slice = threadIdx.x % ROW_SPLIT;          // rows slice + ROW_SPLIT * i
    const bool live = col < DV;
    const float scale = 1.0f / sqrtf((float)DK);        // FLA's default DK ** -0.5

    // ---- the state: ROWS_PER_THREAD rows of one column, fp32 registers -------------------------
    float s[ROWS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ROWS_PER_THREAD; ++i) s[i] = 0.f;

    for (int t0 = 0; t0 < T; t0 += TOKENS_PER_TILE) {
        __syncthreads();  // the previous tile is fully read
        stage_tile(q_s, k_s, v_s, decay_s, beta_s, q, k, v, g, beta, b, hv, hq, t0, T, H, HV, DK, DV);
        __syncthreads();
        const int tokens = min(TOKENS_PER_TILE, T - t0);
        for (int tt = 0; tt < tokens; ++tt) {
            const float* kt = k_s + tt * MAX_DK + slice;
            const float* qt = q_s + tt * MAX_DK + slice;
            const float a = decay_s[tt];
            // ---- decay and S^T k (rows beyond DK hold zero state and zero k) ------------------
            float kv = 0.f;
#pragma unroll
            for (int i = 0; i < ROWS_PER_THREAD; ++i) {
                s[i] *= a;
                kv = fmaf(s[i], kt[ROW_SPLIT * i], kv);
            }
            kv = column_sum(kv);
            // ---- delta-rule update: S <- S + k u^T, u = beta (v - S^T k) -----------------------
            const float u = beta_s[tt] * ((live ? v_s[tt * MAX_DV + col] : 0.f) - kv);
            float qs = 0.f;
#pragma unroll
            for (int i = 0; i < ROWS_PER_THREAD; ++i) {
                s[i] = fmaf(kt[ROW_SPLIT * i], u, s[i]);
                qs = fmaf(s[i], qt[ROW_SPLIT * i], qs);
            }
            qs = column_sum(qs);
            // ---- epilogue: o = scale S^T q, one bf16 rounding ----------------------------------
            if (live && slice == 0) {
                const int t = t0 + tt;
                o[((int64_t)(b * T + t) * HV + hv) * DV + col] = __float2bfloat16_rn(qs * scale);
            }
        }
    }
}
