// Gated delta rule, chunked (the WY / UT form), in two launches shaped for the H200's tensor cores.
//
// Launch 1, gdn_chunk_prep: everything that does not depend on the state, for every chunk of 64 tokens at
// once. One CTA per (chunk, value head, batch), 4 warps; value head hv reads q/k head hv / (HV / H).
//   G   = the in-chunk cumulative sum of g (fp32, in token order)              -> scratch gate_cum
//   L   = strict_tril(beta_i (k_i . k_j) e^(G_i - G_j))                        mma: K K^T
//   P   = tril((q_i . k_j) e^(G_i - G_j)), rounded to bf16                     mma: Q K^T -> scratch qk_p
//   X   = (I + L)^-1 in fp32: the four 16 x 16 diagonal blocks by forward substitution (a column per
//         thread), then block rows 1..3: X_ij = -X_ii sum_{j <= m < i} L_im X_mj
//   Xb  = X diag(beta), rounded to bf16                                        -> scratch wy_x
// Launch 2, gdn_chunk_state: the sequential part. One CTA per (slice of BV value columns, value head,
// batch), 8 warps; the fp32 state slice S [128 x BV] stays in the warps' mma accumulators (warp w holds
// state rows 16w .. 16w + 15) for the whole sequence. Per chunk, with S the state at the chunk's start:
//   R   = v - e^G (K S)                       mma (S rounded to bf16 as the operand), R rounded to bf16
//   Vn  = Xb R                                mma: the WY form's U - W S, as X diag(beta) (V - e^G K S)
//   O   = scale (e^G (Q S) + P Vn)            mma, rounded to bf16 once
//   S  <- e^(G_last) S + K^T (e^(G_last - G) Vn)
// while cp.async brings the next chunk's q, k, Xb, P, v slice and G into the other stage buffer.
// Tokens past T are staged as zeros (k = q = v = 0; beta = g = 0, so G stays flat): they change nothing.
// Every mma is mma.sync.m16n8k16 bf16 -> fp32 with ldmatrix fragments; shared tiles have 16 bytes of
// padding per row, so the eight 16-byte rows of one ldmatrix phase fall in different bank groups.
#include <cuda_bf16.h>
#include <stdint.h>

constexpr int CHUNK = 64;                // tokens per chunk (FLA's size)
constexpr int MAX_DK = 128;              // state rows (DK <= MAX_DK, zero-padded)
constexpr int MAX_DV = 128;              // state columns (DV <= MAX_DV)
constexpr int BV = 64;                   // value columns per state CTA (a multiple of 32)
constexpr int SUB = 16;                  // diagonal blocks of the solve, and the mma tile edge
constexpr int NSUB = CHUNK / SUB;        // 4
constexpr int WARP = 32;
constexpr int PREP_THREADS = 128;        // 4 warps: warp w owns token rows 16w .. 16w + 15 of K K^T, Q K^T
constexpr int STATE_WARPS = 8;           // warp w: state rows 16w .. 16w + 15 (8 x 16 = MAX_DK)
constexpr int STATE_THREADS = STATE_WARPS * WARP;
// Shared-memory row strides, in elements (each a multiple of 16 bytes, 16 bytes over the data).
constexpr int KSTRIDE = MAX_DK + 8;      // q, k rows: 272 bytes
constexpr int CSTRIDE = CHUNK + 8;       // Xb, P rows: 144 bytes
constexpr int VSTRIDE = BV + 8;          // v slice, S, R, Vn rows: 144 bytes
constexpr int FSTRIDE = CHUNK + 4;       // fp32 L and X rows in the solve: 272 bytes
constexpr int KTILE_BYTES = CHUNK * KSTRIDE * 2;  // 17408 = CHUNK * FSTRIDE * 4
// gdn_chunk_prep's shared memory (bytes). L and X reuse the k and q tiles once K K^T and Q K^T are done.
constexpr int P_OFF_K = 0;                                  // k [CHUNK][KSTRIDE] bf16, then L [CHUNK][FSTRIDE] fp32
constexpr int P_OFF_Q = P_OFF_K + KTILE_BYTES;              // q, then X
constexpr int P_OFF_T = P_OFF_Q + KTILE_BYTES;              // T blocks [NSUB - 1][SUB][SUB] fp32
constexpr int P_OFF_G = P_OFF_T + (NSUB - 1) * SUB * SUB * 4;   // G [CHUNK] fp32
constexpr int P_OFF_GRAW = P_OFF_G + CHUNK * 4;             // g [CHUNK] fp32
constexpr int P_OFF_BETA = P_OFF_GRAW + CHUNK * 4;          // beta [CHUNK] fp32
constexpr int PREP_SMEM = P_OFF_BETA + CHUNK * 4;           // 38656
// gdn_chunk_state's shared memory (bytes): two stages of chunk inputs, then the per-chunk operands.
constexpr int S_OFF_K = 0;                                  // k [CHUNK][KSTRIDE] bf16
constexpr int S_OFF_Q = S_OFF_K + KTILE_BYTES;              // q [CHUNK][KSTRIDE] bf16
constexpr int S_OFF_X = S_OFF_Q + KTILE_BYTES;              // Xb [CHUNK][CSTRIDE] bf16
constexpr int S_OFF_P = S_OFF_X + CHUNK * CSTRIDE * 2;      // P [CHUNK][CSTRIDE] bf16
constexpr int S_OFF_V = S_OFF_P + CHUNK * CSTRIDE * 2;      // v slice [CHUNK][VSTRIDE] bf16
constexpr int S_OFF_G = S_OFF_V + CHUNK * VSTRIDE * 2;      // G [CHUNK] fp32
constexpr int STAGE_BYTES = S_OFF_G + CHUNK * 4;            // 62720
constexpr int S_OFF_SB = 2 * STAGE_BYTES;                   // S as bf16 [MAX_DK][VSTRIDE]
constexpr int S_OFF_R = S_OFF_SB + MAX_DK * VSTRIDE * 2;    // R [CHUNK][VSTRIDE] bf16, then O staging
constexpr int S_OFF_VN = S_OFF_R + CHUNK * VSTRIDE * 2;     // Vn [CHUNK][VSTRIDE] bf16
constexpr int S_OFF_VD = S_OFF_VN + CHUNK * VSTRIDE * 2;    // e^(G_last - G) Vn [CHUNK][VSTRIDE] bf16
constexpr int STATE_SMEM = S_OFF_VD + CHUNK * VSTRIDE * 2;  // 171520

static_assert(MAX_DK == STATE_WARPS * SUB, "one 16-row band of the state per warp");
static_assert(BV % 32 == 0 && MAX_DV % BV == 0, "each warp takes half a slice in 16-column pairs");
static_assert(CHUNK * KSTRIDE * 2 == CHUNK * FSTRIDE * 4, "L and X fit the k and q tiles exactly");
static_assert(STAGE_BYTES % 16 == 0, "stages stay 16-byte aligned");

typedef __nv_bfloat16 bf16;

// ---- PTX wrappers ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8, and register i gets
// row lane / 4, columns 2 (lane % 4) and 2 (lane % 4) + 1 of matrix i.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row))
                 : "memory");
}

// The same, transposed: register i gets rows 2 (lane % 4) and 2 (lane % 4) + 1 of column lane / 4.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row))
                 : "memory");
}

// d += a b for one 16 x 8 tile, K = 16: bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, asynchronously; zeros instead when `valid` is false (nothing is read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// ---- fragment addressing (element offsets of this lane's ldmatrix row) ---------------------------
// rows16: a 16 x 16 block at (r0, c0) as matrices (r0, c0), (r0 + 8, c0), (r0, c0 + 8), (r0 + 8, c0 + 8).
// Loaded plainly it is an A fragment of a tile stored [m][k]; loaded .trans, the B fragments (b0, b1) of
// the n-tiles c0 and c0 + 8 of a tile stored [k][n].
__device__ __forceinline__ int rows16(int r0, int c0, int stride, int lane)
{
    return (r0 + (lane & 15)) * stride + c0 + ((lane >> 4) << 3);
}

// cols16: a 16 x 16 block at (r0, c0) as matrices (r0, c0), (r0, c0 + 8), (r0 + 8, c0), (r0 + 8, c0 + 8).
// Loaded plainly it is the B fragments of the n-tiles r0 and r0 + 8 of a tile stored [n][k] (k from c0);
// loaded .trans, an A fragment of a tile stored [k][m] (k from r0, m from c0).
__device__ __forceinline__ int cols16(int r0, int c0, int stride, int lane)
{
    return (r0 + (lane & 7) + ((lane >> 4) << 3)) * stride + c0 + (((lane >> 3) & 1) << 3);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void store_bf16x2(bf16* p, float lo, float hi)
{
    *reinterpret_cast<uint32_t*>(p) = pack_bf16(lo, hi);
}

__device__ __forceinline__ float2 load_bf16x2(const bf16* p)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// ---- launch 1: the chunk-local part, all chunks in parallel --------------------------------------
extern "C" __global__ void __launch_bounds__(PREP_THREADS)
gdn_chunk_prep(const bf16* __restrict__ q, const bf16* __restrict__ k, const float* __restrict__ g,
               const bf16* __restrict__ beta, bf16* __restrict__ wy_x, bf16* __restrict__ qk_p,
               float* __restrict__ gate_cum, int B, int T, int H, int HV, int DK)
{
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* k_s = reinterpret_cast<bf16*>(smem + P_OFF_K);
    bf16* q_s = reinterpret_cast<bf16*>(smem + P_OFF_Q);
    float* l_s = reinterpret_cast<float*>(smem + P_OFF_K);  // after K K^T
    float* x_s = reinterpret_cast<float*>(smem + P_OFF_Q);  // after Q K^T
    float* t_s = reinterpret_cast<float*>(smem + P_OFF_T);
    float* g_s = reinterpret_cast<float*>(smem + P_OFF_G);
    float* graw_s = reinterpret_cast<float*>(smem + P_OFF_GRAW);
    float* beta_s = reinterpret_cast<float*>(smem + P_OFF_BETA);

    const int c = blockIdx.x, hv = blockIdx.y, b = blockIdx.z;
    const int NT = (T + CHUNK - 1) / CHUNK;
    const int hq = hv / (HV / H);
    const int t0 = c * CHUNK;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t chunk_id = (int64_t)(b * HV + hv) * NT + c;

    // q and k rows of the chunk, 16 bytes at a time; zeros past T and past DK.
    constexpr int ROW_VECS = MAX_DK / 8;
    for (int i = tid; i < CHUNK * ROW_VECS; i += PREP_THREADS) {
        const int row = i / ROW_VECS, d = (i % ROW_VECS) * 8, t = t0 + row;
        const bool ok = t < T && d < DK;
        const int64_t off = ok ? ((int64_t)(b * T + t) * H + hq) * DK + d : 0;
        cp_async16(k_s + row * KSTRIDE + d, k + off, ok);
        cp_async16(q_s + row * KSTRIDE + d, q + off, ok);
    }
    cp_async_commit();
    if (tid < CHUNK) {
        const int t = t0 + tid;
        float gv = 0.f, bv = 0.f;
        if (t < T) {
            const int64_t off = (int64_t)(b * T + t) * HV + hv;
            gv = g[off];
            bv = __bfloat162float(beta[off]);
        }
        graw_s[tid] = gv;
        beta_s[tid] = bv;
    }
    __syncthreads();
    if (tid < CHUNK) {  // G_t = g_0 + ... + g_t, summed in token order
        float acc = 0.f;
        for (int i = 0; i <= tid; ++i) acc += graw_s[i];
        g_s[tid] = acc;
        gate_cum[chunk_id * CHUNK + tid] = acc;
    }
    cp_async_wait_all();
    __syncthreads();

    // K K^T and Q K^T for token rows 16 warp .. + 15; column pairs above the diagonal stay zero.
    float kk[CHUNK / 8][4], qk[CHUNK / 8][4];
#pragma unroll
    for (int j = 0; j < CHUNK / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) kk[j][e] = qk[j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < MAX_DK / 16; ++ks) {
        uint32_t ak[4], aq[4];
        ldsm_x4(ak, k_s + rows16(warp * 16, ks * 16, KSTRIDE, lane));
        ldsm_x4(aq, q_s + rows16(warp * 16, ks * 16, KSTRIDE, lane));
#pragma unroll
        for (int np = 0; np < CHUNK / 16; ++np) {
            if (np <= warp) {
                uint32_t bk[4];  // B(d, s) = k[s][d]: stored [n][k]
                ldsm_x4(bk, k_s + cols16(np * 16, ks * 16, KSTRIDE, lane));
                mma_bf16(kk[2 * np], ak, bk[0], bk[1]);
                mma_bf16(kk[2 * np + 1], ak, bk[2], bk[3]);
                mma_bf16(qk[2 * np], aq, bk[0], bk[1]);
                mma_bf16(qk[2 * np + 1], aq, bk[2], bk[3]);
            }
        }
    }
    __syncthreads();  // k and q tiles become L and X

    // L (fp32, shared) and P (bf16, global); accumulator e of n-tile j is row r0 + 8 (e / 2), column
    // 8 j + 2 (lane % 4) + e % 2.
    const int g8 = lane >> 2, t4 = lane & 3;
    const int r0 = warp * 16 + g8;
    bf16* p_out = qk_p + chunk_id * CHUNK * CHUNK;
#pragma unroll
    for (int j = 0; j < CHUNK / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = r0 + 8 * h;
            float lv[2], pv[2];
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                const int jj = 8 * j + 2 * t4 + e2;
                const float decay = i >= jj ? expf(g_s[i] - g_s[jj]) : 0.f;
                lv[e2] = i > jj ? beta_s[i] * kk[j][2 * h + e2] * decay : 0.f;
                pv[e2] = i >= jj ? qk[j][2 * h + e2] * decay : 0.f;
            }
            l_s[i * FSTRIDE + 8 * j + 2 * t4] = lv[0];
            l_s[i * FSTRIDE + 8 * j + 2 * t4 + 1] = lv[1];
            store_bf16x2(p_out + i * CHUNK + 8 * j + 2 * t4, pv[0], pv[1]);
        }
    }
    __syncthreads();

    // The diagonal blocks: thread j of block bk solves (I + L_kk) x = e_j by forward substitution.
    if (tid < CHUNK) {
        const int base = (tid / SUB) * SUB, j = tid % SUB;
        float x[SUB];
#pragma unroll
        for (int i = 0; i < SUB; ++i) {
            float s = i == j ? 1.f : 0.f;
#pragma unroll
            for (int m = 0; m < i; ++m) s = fmaf(-l_s[(base + i) * FSTRIDE + base + m], x[m], s);
            x[i] = s;
        }
#pragma unroll
        for (int i = 0; i < SUB; ++i) x_s[(base + i) * FSTRIDE + base + j] = x[i];
    }
    __syncthreads();

    // Block rows 1 .. NSUB - 1: T_j = sum_{j <= m < bi} L_{bi,m} X_{m,j}, then X_{bi,j} = -X_{bi,bi} T_j.
    for (int bi = 1; bi < NSUB; ++bi) {
        const int rb = bi * SUB;
        for (int e = tid; e < bi * SUB * SUB; e += PREP_THREADS) {
            const int j = e / (SUB * SUB), r = (e / SUB) % SUB, col = j * SUB + e % SUB;
            float s = 0.f;
            for (int mb = j; mb < bi; ++mb) {
#pragma unroll
                for (int p = 0; p < SUB; ++p)
                    s = fmaf(l_s[(rb + r) * FSTRIDE + mb * SUB + p], x_s[(mb * SUB + p) * FSTRIDE + col], s);
            }
            t_s[e] = s;
        }
        __syncthreads();
        for (int e = tid; e < bi * SUB * SUB; e += PREP_THREADS) {
            const int j = e / (SUB * SUB), r = (e / SUB) % SUB, cc = e % SUB;
            float s = 0.f;  // X_{bi,bi} is lower triangular: its zeros above the diagonal add nothing
#pragma unroll
            for (int p = 0; p < SUB; ++p) s = fmaf(x_s[(rb + r) * FSTRIDE + rb + p], t_s[j * SUB * SUB + p * SUB + cc], s);
            x_s[(rb + r) * FSTRIDE + j * SUB + cc] = -s;
        }
        __syncthreads();
    }

    // Xb = X diag(beta) as bf16, lower triangle and diagonal (X_ii = 1), 16 bytes per store.
    bf16* x_out = wy_x + chunk_id * CHUNK * CHUNK;
    for (int i = tid; i < CHUNK * CHUNK / 8; i += PREP_THREADS) {
        const int row = i / (CHUNK / 8), col = (i % (CHUNK / 8)) * 8;
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int s0 = col + 2 * e, s1 = s0 + 1;
            const float x0 = row >= s0 ? x_s[row * FSTRIDE + s0] * beta_s[s0] : 0.f;
            const float x1 = row >= s1 ? x_s[row * FSTRIDE + s1] * beta_s[s1] : 0.f;
            w[e] = pack_bf16(x0, x1);
        }
        *reinterpret_cast<uint4*>(x_out + row * CHUNK + col) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// ---- launch 2: the state recurrence over chunks ----------------------------------------------------
// One chunk's inputs into a stage buffer: q, k rows (zeros past T and DK), Xb, P, G (always whole: launch 1
// wrote every chunk in full), the v slice (zeros past T and DV). One commit group per chunk.
__device__ __forceinline__ void load_chunk(unsigned char* stage, const bf16* __restrict__ q,
                                           const bf16* __restrict__ k, const bf16* __restrict__ v,
                                           const bf16* __restrict__ wy_x, const bf16* __restrict__ qk_p,
                                           const float* __restrict__ gate_cum, int b, int hv, int hq, int v0,
                                           int c, int NT, int T, int H, int HV, int DK, int DV)
{
    const int tid = threadIdx.x, t0 = c * CHUNK;
    const int64_t chunk_id = (int64_t)(b * HV + hv) * NT + c;
    constexpr int ROW_VECS = MAX_DK / 8;
    for (int i = tid; i < CHUNK * ROW_VECS; i += STATE_THREADS) {
        const int row = i / ROW_VECS, d = (i % ROW_VECS) * 8, t = t0 + row;
        const bool ok = t < T && d < DK;
        const int64_t off = ok ? ((int64_t)(b * T + t) * H + hq) * DK + d : 0;
        cp_async16(stage + S_OFF_K + (row * KSTRIDE + d) * 2, k + off, ok);
        cp_async16(stage + S_OFF_Q + (row * KSTRIDE + d) * 2, q + off, ok);
    }
    constexpr int C_VECS = CHUNK / 8;
    for (int i = tid; i < CHUNK * C_VECS; i += STATE_THREADS) {
        const int row = i / C_VECS, col = (i % C_VECS) * 8;
        const int64_t off = chunk_id * CHUNK * CHUNK + row * CHUNK + col;
        cp_async16(stage + S_OFF_X + (row * CSTRIDE + col) * 2, wy_x + off, true);
        cp_async16(stage + S_OFF_P + (row * CSTRIDE + col) * 2, qk_p + off, true);
    }
    constexpr int V_VECS = BV / 8;
    for (int i = tid; i < CHUNK * V_VECS; i += STATE_THREADS) {
        const int row = i / V_VECS, col = (i % V_VECS) * 8, t = t0 + row;
        const bool ok = t < T && v0 + col < DV;
        const int64_t off = ok ? ((int64_t)(b * T + t) * HV + hv) * DV + v0 + col : 0;
        cp_async16(stage + S_OFF_V + (row * VSTRIDE + col) * 2, v + off, ok);
    }
    if (tid < CHUNK / 4) cp_async16(stage + S_OFF_G + tid * 16, gate_cum + chunk_id * CHUNK + tid * 4, true);
    cp_async_commit();
}

extern "C" __global__ void __launch_bounds__(STATE_THREADS, 1)
gdn_chunk_state(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                const bf16* __restrict__ wy_x, const bf16* __restrict__ qk_p, const float* __restrict__ gate_cum,
                bf16* __restrict__ o, int B, int T, int H, int HV, int DK, int DV)
{
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* sb_s = reinterpret_cast<bf16*>(smem + S_OFF_SB);
    bf16* r_s = reinterpret_cast<bf16*>(smem + S_OFF_R);
    bf16* vn_s = reinterpret_cast<bf16*>(smem + S_OFF_VN);
    bf16* vd_s = reinterpret_cast<bf16*>(smem + S_OFF_VD);

    const int v0 = blockIdx.x * BV, hv = blockIdx.y, b = blockIdx.z;
    const int NT = (T + CHUNK - 1) / CHUNK;
    const int hq = hv / (HV / H);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, t4 = lane & 3;
    // Phases A to C: this warp's 16 token rows and BV / 2 value columns.
    const int mt = warp & 3, nb = (warp >> 2) * (BV / 2);
    const int r0 = mt * 16 + g8;  // its accumulator rows r0 and r0 + 8
    const float scale = 1.0f / sqrtf((float)DK);

    float S[BV / 8][4];  // state rows 16 warp + g8 (+ 8), columns 8 j + 2 t4 (+ 1)
#pragma unroll
    for (int j = 0; j < BV / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[j][e] = 0.f;
    for (int i = tid; i < MAX_DK * VSTRIDE / 2; i += STATE_THREADS) reinterpret_cast<uint32_t*>(sb_s)[i] = 0u;

    load_chunk(smem, q, k, v, wy_x, qk_p, gate_cum, b, hv, hq, v0, 0, NT, T, H, HV, DK, DV);
    cp_async_wait_all();
    __syncthreads();

    for (int c = 0; c < NT; ++c) {
        unsigned char* stage = smem + (c & 1) * STAGE_BYTES;
        if (c + 1 < NT)
            load_chunk(smem + ((c + 1) & 1) * STAGE_BYTES, q, k, v, wy_x, qk_p, gate_cum, b, hv, hq, v0, c + 1, NT,
                       T, H, HV, DK, DV);
        const bf16* k_s = reinterpret_cast<const bf16*>(stage + S_OFF_K);
        const bf16* q_s = reinterpret_cast<const bf16*>(stage + S_OFF_Q);
        const bf16* x_s = reinterpret_cast<const bf16*>(stage + S_OFF_X);
        const bf16* p_s = reinterpret_cast<const bf16*>(stage + S_OFF_P);
        const bf16* v_s = reinterpret_cast<const bf16*>(stage + S_OFF_V);
        const float* g_s = reinterpret_cast<const float*>(stage + S_OFF_G);
        const int t0 = c * CHUNK;

        // Phase A: K S and Q S (S as bf16 from sb_s); R = v - e^G (K S); keep e^G (Q S) for the output.
        float ks[BV / 16][4], oacc[BV / 16][4];
#pragma unroll
        for (int j = 0; j < BV / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) ks[j][e] = oacc[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < MAX_DK / 16; ++kk) {
            uint32_t ak[4], aq[4];
            ldsm_x4(ak, k_s + rows16(mt * 16, kk * 16, KSTRIDE, lane));
            ldsm_x4(aq, q_s + rows16(mt * 16, kk * 16, KSTRIDE, lane));
#pragma unroll
            for (int np = 0; np < BV / 32; ++np) {
                uint32_t bs[4];
                ldsm_x4_t(bs, sb_s + rows16(kk * 16, nb + np * 16, VSTRIDE, lane));
                mma_bf16(ks[2 * np], ak, bs[0], bs[1]);
                mma_bf16(ks[2 * np + 1], ak, bs[2], bs[3]);
                mma_bf16(oacc[2 * np], aq, bs[0], bs[1]);
                mma_bf16(oacc[2 * np + 1], aq, bs[2], bs[3]);
            }
        }
        const float e0 = expf(g_s[r0]), e1 = expf(g_s[r0 + 8]);
#pragma unroll
        for (int j = 0; j < BV / 16; ++j) {
            const int col = nb + 8 * j + 2 * t4;
            const float2 va = load_bf16x2(v_s + r0 * VSTRIDE + col);
            const float2 vb = load_bf16x2(v_s + (r0 + 8) * VSTRIDE + col);
            store_bf16x2(r_s + r0 * VSTRIDE + col, fmaf(-e0, ks[j][0], va.x), fmaf(-e0, ks[j][1], va.y));
            store_bf16x2(r_s + (r0 + 8) * VSTRIDE + col, fmaf(-e1, ks[j][2], vb.x), fmaf(-e1, ks[j][3], vb.y));
            oacc[j][0] *= e0;
            oacc[j][1] *= e0;
            oacc[j][2] *= e1;
            oacc[j][3] *= e1;
        }
        __syncthreads();

        // Phase B: Vn = Xb R (Xb is lower triangular: k-blocks 0 .. mt); Vn and e^(G_last - G) Vn as bf16.
        float vn[BV / 16][4];
#pragma unroll
        for (int j = 0; j < BV / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) vn[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < NSUB; ++kk) {
            if (kk <= mt) {
                uint32_t a[4];
                ldsm_x4(a, x_s + rows16(mt * 16, kk * 16, CSTRIDE, lane));
#pragma unroll
                for (int np = 0; np < BV / 32; ++np) {
                    uint32_t bm[4];
                    ldsm_x4_t(bm, r_s + rows16(kk * 16, nb + np * 16, VSTRIDE, lane));
                    mma_bf16(vn[2 * np], a, bm[0], bm[1]);
                    mma_bf16(vn[2 * np + 1], a, bm[2], bm[3]);
                }
            }
        }
        const float g_last = g_s[CHUNK - 1];
        const float d0 = expf(g_last - g_s[r0]), d1 = expf(g_last - g_s[r0 + 8]);
#pragma unroll
        for (int j = 0; j < BV / 16; ++j) {
            const int col = nb + 8 * j + 2 * t4;
            store_bf16x2(vn_s + r0 * VSTRIDE + col, vn[j][0], vn[j][1]);
            store_bf16x2(vn_s + (r0 + 8) * VSTRIDE + col, vn[j][2], vn[j][3]);
            store_bf16x2(vd_s + r0 * VSTRIDE + col, vn[j][0] * d0, vn[j][1] * d0);
            store_bf16x2(vd_s + (r0 + 8) * VSTRIDE + col, vn[j][2] * d1, vn[j][3] * d1);
        }
        __syncthreads();

        // Phase C: O = scale (e^G Q S + P Vn), staged per warp in R's buffer (free since phase B), then
        // written 16 bytes at a time.
#pragma unroll
        for (int kk = 0; kk < NSUB; ++kk) {
            if (kk <= mt) {
                uint32_t a[4];
                ldsm_x4(a, p_s + rows16(mt * 16, kk * 16, CSTRIDE, lane));
#pragma unroll
                for (int np = 0; np < BV / 32; ++np) {
                    uint32_t bm[4];
                    ldsm_x4_t(bm, vn_s + rows16(kk * 16, nb + np * 16, VSTRIDE, lane));
                    mma_bf16(oacc[2 * np], a, bm[0], bm[1]);
                    mma_bf16(oacc[2 * np + 1], a, bm[2], bm[3]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < BV / 16; ++j) {
            const int col = nb + 8 * j + 2 * t4;
            store_bf16x2(r_s + r0 * VSTRIDE + col, scale * oacc[j][0], scale * oacc[j][1]);
            store_bf16x2(r_s + (r0 + 8) * VSTRIDE + col, scale * oacc[j][2], scale * oacc[j][3]);
        }
        __syncwarp();
        constexpr int O_VECS = BV / 16;  // 16-byte vectors per row of the warp's BV / 2 columns
#pragma unroll
        for (int i = lane; i < 16 * O_VECS; i += WARP) {
            const int row = mt * 16 + i / O_VECS, col = nb + (i % O_VECS) * 8, t = t0 + row;
            if (t < T && v0 + col < DV)
                *reinterpret_cast<uint4*>(o + ((int64_t)(b * T + t) * HV + hv) * DV + v0 + col) =
                    *reinterpret_cast<const uint4*>(r_s + row * VSTRIDE + col);
        }

        // Phase C, state: S <- e^(G_last) S + K^T Vd for state rows 16 warp .. + 15, then S as bf16.
        const float decay = expf(g_last);
#pragma unroll
        for (int j = 0; j < BV / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[j][e] *= decay;
#pragma unroll
        for (int kk = 0; kk < NSUB; ++kk) {
            uint32_t a[4];  // A(d, t) = k[t][d]: stored [k][m]
            ldsm_x4_t(a, k_s + cols16(kk * 16, warp * 16, KSTRIDE, lane));
#pragma unroll
            for (int np = 0; np < BV / 16; ++np) {
                uint32_t bm[4];
                ldsm_x4_t(bm, vd_s + rows16(kk * 16, np * 16, VSTRIDE, lane));
                mma_bf16(S[2 * np], a, bm[0], bm[1]);
                mma_bf16(S[2 * np + 1], a, bm[2], bm[3]);
            }
        }
        const int sr = warp * 16 + g8;
#pragma unroll
        for (int j = 0; j < BV / 8; ++j) {
            store_bf16x2(sb_s + sr * VSTRIDE + 8 * j + 2 * t4, S[j][0], S[j][1]);
            store_bf16x2(sb_s + (sr + 8) * VSTRIDE + 8 * j + 2 * t4, S[j][2], S[j][3]);
        }
        cp_async_wait_all();  // the next chunk's stage
        __syncthreads();
    }
}
