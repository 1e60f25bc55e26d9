// Gated delta rule, chunked form (WY / UT transform) with bf16 tensor-core matmuls.
//
// One CTA per (batch, value head); value head hv reads q/k head hv / (HV / H) (GVA). The fp32 state
// S [MAX_DK x MAX_DV] stays in shared memory across the T / CHUNK sequential chunks. Per chunk of
// CHUNK tokens, with G the in-chunk cumulative gate:
//   L   = strict_tril(beta_i (k_i . k_j) exp(G_i - G_j))              (mma: K K^T)
//   X   = (I + L)^-1                                                  (forward substitution, fp32)
//   W   = X (beta exp(G) k),   U = X (beta v)                         (mma, X rounded to bf16)
//   Vn  = U - W S                                                     (mma, S rounded to bf16)
//   O   = scale (exp(G) (Q S) + tril(Q K^T exp(G_i - G_j)) Vn)       (mma, two products per tile)
//   S  <- exp(G_last) S + (k exp(G_last - G))^T Vn                    (mma, fp32 read-modify-write)
// Tokens past T are staged as zeros (k = v = q = 0, g = 0, beta = 0): they change nothing.
// Operands are bf16 in shared memory (S is fp32 and rounded to bf16 as it is loaded); every
// product accumulates in fp32 (mma.sync.m16n8k16 .bf16 -> .f32).
#include <cuda_bf16.h>
#include <stdint.h>

constexpr int CHUNK = 64;                 // tokens per chunk (FLA's and the paper's size)
constexpr int MAX_DK = 128;               // state rows (DK <= MAX_DK, zero-padded)
constexpr int MAX_DV = 128;               // state columns (DV <= MAX_DV, zero-padded)
constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;
constexpr int MMA_M = 16, MMA_N = 8, MMA_K = 16;
// shared memory layout (bytes)
constexpr int TILE_BF16_BYTES = CHUNK * MAX_DK * 2;           // one [CHUNK x 128] bf16 tile
constexpr int OFF_K = 0;                                      // k            [CHUNK][MAX_DK] bf16
constexpr int OFF_Q = OFF_K + TILE_BF16_BYTES;                // q            [CHUNK][MAX_DK] bf16
constexpr int OFF_V = OFF_Q + TILE_BF16_BYTES;                // beta v       [CHUNK][MAX_DV] bf16
constexpr int OFF_KB = OFF_V + TILE_BF16_BYTES;               // beta e^G k, then k e^(G_last - G)
constexpr int OFF_W = OFF_KB + TILE_BF16_BYTES;               // W            [CHUNK][MAX_DK] bf16
constexpr int OFF_U = OFF_W + TILE_BF16_BYTES;                // U            [CHUNK][MAX_DV] bf16
constexpr int OFF_VN = OFF_U + TILE_BF16_BYTES;               // Vn           [CHUNK][MAX_DV] bf16
constexpr int OFF_S = OFF_VN + TILE_BF16_BYTES;               // S            [MAX_DK][MAX_DV] fp32
constexpr int OFF_L = OFF_S + MAX_DK * MAX_DV * 4;            // L, then X    [CHUNK][CHUNK] fp32
constexpr int OFF_X = OFF_L + CHUNK * CHUNK * 4;              // X as bf16    [CHUNK][CHUNK]
constexpr int OFF_P = OFF_X + CHUNK * CHUNK * 2;              // P            [CHUNK][CHUNK] bf16
constexpr int OFF_G = OFF_P + CHUNK * CHUNK * 2;              // G (cumulative gate) [CHUNK] fp32
constexpr int OFF_BETA = OFF_G + CHUNK * 4;                   // beta         [CHUNK] fp32
constexpr int SMEM_BYTES = OFF_BETA + CHUNK * 4;

static_assert(MAX_DK == MAX_DV, "the [CHUNK x 128] tiles share one size");

__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float as_float(float x) { return x; }

// two consecutive-k elements into one bf16x2 register (the lower k in the low half)
template <typename T>
__device__ __forceinline__ uint32_t pack2(const T* p, int i0, int i1) {
    __nv_bfloat162 v = __floats2bfloat162_rn(as_float(p[i0]), as_float(p[i1]));
    return *reinterpret_cast<uint32_t*>(&v);
}

// ---- MMA: one 16 x 8 tile of C += A B, A(m, k) = A[m * a_m + k * a_k], B(k, n) = B[k * b_k + n * b_n] ---
// Fragments of mma.m16n8k16 (g = lane / 4, t = lane % 4): A rows g, g + 8 and columns 2t, 2t + 1,
// 2t + 8, 2t + 9; B rows (k) 2t, 2t + 1, 2t + 8, 2t + 9 of column g; C rows g, g + 8, columns 2t, 2t + 1.
template <typename TA, typename TB>
__device__ __forceinline__ void mma_tile(float acc[4], const TA* A, int a_m, int a_k, const TB* B, int b_k, int b_n,
                                         int m0, int n0, int K) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = (m0 + g) * a_m, r1 = (m0 + g + 8) * a_m, col = (n0 + g) * b_n;
    for (int k0 = 0; k0 < K; k0 += MMA_K) {
        const int ka = k0 + 2 * t;
        uint32_t a0 = pack2(A, r0 + ka * a_k, r0 + (ka + 1) * a_k);
        uint32_t a1 = pack2(A, r1 + ka * a_k, r1 + (ka + 1) * a_k);
        uint32_t a2 = pack2(A, r0 + (ka + 8) * a_k, r0 + (ka + 9) * a_k);
        uint32_t a3 = pack2(A, r1 + (ka + 8) * a_k, r1 + (ka + 9) * a_k);
        uint32_t b0 = pack2(B, ka * b_k + col, (ka + 1) * b_k + col);
        uint32_t b1 = pack2(B, (ka + 8) * b_k + col, (ka + 9) * b_k + col);
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

// the (row, column) of accumulator e of this lane in a tile at (m0, n0)
__device__ __forceinline__ int acc_row(int m0, int e) { return m0 + ((threadIdx.x & 31) >> 2) + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int acc_col(int n0, int e) { return n0 + 2 * (threadIdx.x & 3) + (e & 1); }

// ---- staging: one chunk of q, k, v, g, beta into shared memory as bf16 / fp32, zero past T -------
__device__ __forceinline__ void stage_chunk(__nv_bfloat16* k_s, __nv_bfloat16* q_s, __nv_bfloat16* v_s, float* g_s,
                                            float* beta_s, const __nv_bfloat16* __restrict__ q,
                                            const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                                            const float* __restrict__ g, const __nv_bfloat16* __restrict__ beta,
                                            int b, int hv, int hq, int t0, int T, int H, int HV, int DK, int DV) {
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
    for (int idx = threadIdx.x; idx < CHUNK * MAX_DK; idx += THREADS) {
        const int i = idx / MAX_DK, d = idx % MAX_DK, t = t0 + i;
        __nv_bfloat16 qv = zero, kv = zero, vv = zero;
        if (t < T && d < DK) {
            const int64_t off = ((int64_t)(b * T + t) * H + hq) * DK + d;
            qv = q[off];
            kv = k[off];
        }
        if (t < T && d < DV) vv = v[((int64_t)(b * T + t) * HV + hv) * DV + d];
        q_s[idx] = qv;
        k_s[idx] = kv;
        v_s[idx] = vv;
    }
    if (threadIdx.x < CHUNK) {
        const int t = t0 + threadIdx.x;
        float gv = 0.f, bv = 0.f;
        if (t < T) {
            const int64_t off = (int64_t)(b * T + t) * HV + hv;
            gv = g[off];
            bv = __bfloat162float(beta[off]);
        }
        g_s[threadIdx.x] = gv;
        beta_s[threadIdx.x] = bv;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gdn_chunked(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
            const __nv_bfloat16* __restrict__ v, const float* __restrict__ g,
            const __nv_bfloat16* __restrict__ beta, __nv_bfloat16* __restrict__ o,
            int B, int T, int H, int HV, int DK, int DV) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_K);
    __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_Q);
    __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_V);
    __nv_bfloat16* kb_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_KB);
    __nv_bfloat16* w_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_W);
    __nv_bfloat16* u_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_U);
    __nv_bfloat16* vn_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_VN);
    float* s_s = reinterpret_cast<float*>(smem + OFF_S);
    float* l_s = reinterpret_cast<float*>(smem + OFF_L);
    __nv_bfloat16* x_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_X);
    __nv_bfloat16* p_s = reinterpret_cast<__nv_bfloat16*>(smem + OFF_P);
    float* g_s = reinterpret_cast<float*>(smem + OFF_G);
    float* beta_s = reinterpret_cast<float*>(smem + OFF_BETA);

    const int b = blockIdx.x / HV, hv = blockIdx.x % HV;
    const int hq = hv / (HV / H);
    const int warp = threadIdx.x >> 5;
    const float scale = 1.0f / sqrtf((float)DK);

    for (int idx = threadIdx.x; idx < MAX_DK * MAX_DV; idx += THREADS) s_s[idx] = 0.f;

    for (int t0 = 0; t0 < T; t0 += CHUNK) {
        __syncthreads();  // the previous chunk is done with every buffer
        stage_chunk(k_s, q_s, v_s, g_s, beta_s, q, k, v, g, beta, b, hv, hq, t0, T, H, HV, DK, DV);
        __syncthreads();
        // ---- gate: in-chunk cumulative sum, sequential in token order -----------------------------
        if (threadIdx.x == 0) {
            float acc = 0.f;
            for (int i = 0; i < CHUNK; ++i) { acc += g_s[i]; g_s[i] = acc; }
        }
        __syncthreads();
        const float g_last = g_s[CHUNK - 1];

        // ---- L = strict_tril(beta_i (k_i . k_j) exp(G_i - G_j)); KB = beta e^G k; V <- beta v ----------
        for (int tile = warp; tile < (CHUNK / MMA_M) * (CHUNK / MMA_N); tile += WARPS) {
            const int m0 = (tile / (CHUNK / MMA_N)) * MMA_M, n0 = (tile % (CHUNK / MMA_N)) * MMA_N;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            mma_tile(acc, k_s, MAX_DK, 1, k_s, 1, MAX_DK, m0, n0, MAX_DK);
            for (int e = 0; e < 4; ++e) {
                const int i = acc_row(m0, e), j = acc_col(n0, e);
                l_s[i * CHUNK + j] = i > j ? beta_s[i] * acc[e] * expf(g_s[i] - g_s[j]) : 0.f;
            }
        }
        for (int idx = threadIdx.x; idx < CHUNK * MAX_DK; idx += THREADS) {
            const int i = idx / MAX_DK;
            kb_s[idx] = __float2bfloat16_rn(beta_s[i] * expf(g_s[i]) * __bfloat162float(k_s[idx]));
            v_s[idx] = __float2bfloat16_rn(beta_s[i] * __bfloat162float(v_s[idx]));
        }
        __syncthreads();

        // ---- solve: X = (I + L)^-1 by forward substitution, row by row, in place over L -----------
        // X[i][j] = -(L[i][j] + sum_{j < m < i} L[i][m] X[m][j]) for j < i (rows m < i already hold X)
        for (int i = 1; i < CHUNK; ++i) {
            const int j = threadIdx.x;
            float x = 0.f;
            if (j < i) {
                x = l_s[i * CHUNK + j];
                for (int m = j + 1; m < i; ++m) x = fmaf(l_s[i * CHUNK + m], l_s[m * CHUNK + j], x);
            }
            __syncthreads();
            if (j < i) l_s[i * CHUNK + j] = -x;
            __syncthreads();
        }
        for (int idx = threadIdx.x; idx < CHUNK * CHUNK; idx += THREADS) {
            const int i = idx / CHUNK, j = idx % CHUNK;
            x_s[idx] = __float2bfloat16_rn(i == j ? 1.f : (i > j ? l_s[idx] : 0.f));
        }
        __syncthreads();

        // ---- W = X KB, U = X (beta v): the WY representation ----------------------------------------
        for (int tile = warp; tile < 2 * (CHUNK / MMA_M) * (MAX_DK / MMA_N); tile += WARPS) {
            const int which = tile / ((CHUNK / MMA_M) * (MAX_DK / MMA_N));
            const int rest = tile % ((CHUNK / MMA_M) * (MAX_DK / MMA_N));
            const int m0 = (rest / (MAX_DK / MMA_N)) * MMA_M, n0 = (rest % (MAX_DK / MMA_N)) * MMA_N;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            mma_tile(acc, x_s, CHUNK, 1, which == 0 ? kb_s : v_s, MAX_DK, 1, m0, n0, CHUNK);
            __nv_bfloat16* dst = which == 0 ? w_s : u_s;
            for (int e = 0; e < 4; ++e) dst[acc_row(m0, e) * MAX_DK + acc_col(n0, e)] = __float2bfloat16_rn(acc[e]);
        }
        __syncthreads();

        // ---- Vn = U - W S;  P = tril(Q K^T exp(G_i - G_j)) -------------------------------------------
        for (int tile = warp; tile < (CHUNK / MMA_M) * (MAX_DV / MMA_N); tile += WARPS) {
            const int m0 = (tile / (MAX_DV / MMA_N)) * MMA_M, n0 = (tile % (MAX_DV / MMA_N)) * MMA_N;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            mma_tile(acc, w_s, MAX_DK, 1, s_s, MAX_DV, 1, m0, n0, MAX_DK);
            for (int e = 0; e < 4; ++e) {
                const int idx = acc_row(m0, e) * MAX_DV + acc_col(n0, e);
                vn_s[idx] = __float2bfloat16_rn(__bfloat162float(u_s[idx]) - acc[e]);
            }
        }
        for (int tile = warp; tile < (CHUNK / MMA_M) * (CHUNK / MMA_N); tile += WARPS) {
            const int m0 = (tile / (CHUNK / MMA_N)) * MMA_M, n0 = (tile % (CHUNK / MMA_N)) * MMA_N;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            mma_tile(acc, q_s, MAX_DK, 1, k_s, 1, MAX_DK, m0, n0, MAX_DK);
            for (int e = 0; e < 4; ++e) {
                const int i = acc_row(m0, e), j = acc_col(n0, e);
                p_s[i * CHUNK + j] = __float2bfloat16_rn(i >= j ? acc[e] * expf(g_s[i] - g_s[j]) : 0.f);
            }
        }
        __syncthreads();

        // ---- epilogue: O = scale (e^G (Q S) + P Vn), one bf16 rounding; KB <- k e^(G_last - G) ----------
        for (int tile = warp; tile < (CHUNK / MMA_M) * (MAX_DV / MMA_N); tile += WARPS) {
            const int m0 = (tile / (MAX_DV / MMA_N)) * MMA_M, n0 = (tile % (MAX_DV / MMA_N)) * MMA_N;
            float inter[4] = {0.f, 0.f, 0.f, 0.f}, intra[4] = {0.f, 0.f, 0.f, 0.f};
            mma_tile(inter, q_s, MAX_DK, 1, s_s, MAX_DV, 1, m0, n0, MAX_DK);
            mma_tile(intra, p_s, CHUNK, 1, vn_s, MAX_DV, 1, m0, n0, CHUNK);
            for (int e = 0; e < 4; ++e) {
                const int i = acc_row(m0, e), n = acc_col(n0, e), t = t0 + i;
                if (t < T && n < DV)
                    o[((int64_t)(b * T + t) * HV + hv) * DV + n] =
                        __float2bfloat16_rn(scale * fmaf(expf(g_s[i]), inter[e], intra[e]));
            }
        }
        for (int idx = threadIdx.x; idx < CHUNK * MAX_DK; idx += THREADS) {
            const int i = idx / MAX_DK;
            kb_s[idx] = __float2bfloat16_rn(expf(g_last - g_s[i]) * __bfloat162float(k_s[idx]));
        }
        __syncthreads();

        // ---- state: S <- e^(G_last) S + KB^T Vn ------------------------------------------------------
        const float decay = expf(g_last);
        for (int tile = warp; tile < (MAX_DK / MMA_M) * (MAX_DV / MMA_N); tile += WARPS) {
            const int m0 = (tile / (MAX_DV / MMA_N)) * MMA_M, n0 = (tile % (MAX_DV / MMA_N)) * MMA_N;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            mma_tile(acc, kb_s, 1, MAX_DK, vn_s, MAX_DV, 1, m0, n0, CHUNK);
            for (int e = 0; e < 4; ++e) {
                const int idx = acc_row(m0, e) * MAX_DV + acc_col(n0, e);
                s_s[idx] = fmaf(decay, s_s[idx], acc[e]);
            }
        }
    }
}
