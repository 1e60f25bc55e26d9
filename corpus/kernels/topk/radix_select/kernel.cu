// Top-k per row by radix select, in one launch and one pass over global memory.
//
// One block of THREADS threads per row:
//   1. load      the row once from global memory (128-bit loads when the row start is 16-byte
//                aligned, which holds for every row exactly when S % 4 == 0), turned into
//                order-preserving uint32 keys and kept in shared memory for every later step;
//   2. select    the K-th largest key digit by digit (RADIX_BITS per pass, most significant first):
//                a shared-memory histogram of the digit over the keys that still match the prefix,
//                then one warp scans the histogram from the top to find the bucket holding the K-th
//                largest. It stops early when every key of that bucket belongs to the top K;
//   3. gather    the keys above the found prefix and as many keys equal to it as are still needed,
//                compacted in a fixed order (a block-wide scan of per-thread counts, no atomics), so
//                the same input always selects the same elements;
//   4. sort      the K selected (key, index) pairs, padded to a power of two, by a bitonic network:
//                strides below 32 in registers with warp shuffles, longer strides in shared memory;
//   5. store     values (the keys turned back into floats, bit-exact) and int64 indices.
//
// Order: key descending, then index ascending, packed into one 64-bit word, so the output is a
// total order of the input and identical on every run. -0.0 sorts below +0.0 (their bit patterns
// differ); the problem compares values by value, so either order is right.
//
// Shared memory (dynamic): round_up(S, 4) keys (4 bytes each) followed by next_pow2(K) 64-bit sort
// slots; the plan's `supports` requires them to fit the opt-in limit (S up to ~56K for small K).
// Static: the histogram, per-warp scan totals and the selection state.

#include <cstdint>

constexpr int THREADS = 1024;                       // one block per row; 32 warps share the passes
constexpr int WARPS = THREADS / 32;
constexpr int VEC = 4;                              // floats per 128-bit load (float4)
constexpr int LOAD_BATCH = 8;                       // 128-bit loads a thread issues before it stores any
constexpr int RADIX_BITS = 8;                       // digit width: 256 bins, 4 passes over 32-bit keys
constexpr int RADIX_BINS = 1 << RADIX_BITS;
constexpr int RADIX_PASSES = 32 / RADIX_BITS;
constexpr int BINS_PER_LANE = RADIX_BINS / 32;      // the selecting warp's lane owns this many bins
constexpr int WARP_AGGREGATE = 1;                   // 1: a warp whose candidates share a digit adds once
constexpr int WARP_SORT_STRIDES = 32;               // bitonic strides below this run in registers
constexpr int STATIC_SMEM_RESERVE = 2048;           // bound on the static shared memory, used by the plan
constexpr unsigned FULL_MASK = 0xffffffffu;

static_assert(THREADS % 32 == 0 && WARPS <= 32, "the block scan keeps one total per warp in one warp");
static_assert(32 % RADIX_BITS == 0 && BINS_PER_LANE >= 1, "digits must tile the key; one warp scans the bins");
static_assert(WARP_SORT_STRIDES == 32, "register strides are exactly those within a warp");

struct SelectState {
    uint32_t prefix;  // the digits of the K-th largest key found so far
    uint32_t mask;    // which bits of `prefix` are known
    int k_left;       // how many keys matching the prefix still belong to the top K
    int done;         // 1 when every key matching the prefix belongs to the top K, or all bits are known
};
static_assert(RADIX_BINS * 4 + WARPS * 4 + sizeof(SelectState) <= STATIC_SMEM_RESERVE,
              "the plan's supports bound reserves STATIC_SMEM_RESERVE bytes for the static shared memory");

// ---- Key transform -------------------------------------------------------------------------------
// Unsigned order of the keys is the float order: positives get the sign bit set, negatives have every
// bit flipped (so larger magnitudes become smaller keys). -inf is 0x007FFFFF, +inf 0xFF800000; only a
// NaN could map to 0 or above +inf, and the inputs hold none.
__device__ __forceinline__ uint32_t float_to_key(float f)
{
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_to_float(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Key descending then index ascending, as one unsigned word: the sort needs only 64-bit compares.
// Every real pair is > 0 (keys are >= 0x007FFFFF), so 0 pads the sort buffer and sinks to the end.
__device__ __forceinline__ unsigned long long pack(uint32_t key, int idx)
{
    return (static_cast<unsigned long long>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(idx));
}

__device__ __forceinline__ int next_pow2(int n) { return n <= 1 ? 1 : 1 << (32 - __clz(n - 1)); }

// ---- Vectorized row load ---------------------------------------------------------------------------
// Global -> keys in shared memory, once. LOAD_BATCH independent loads per thread are in flight before
// the first store, so a long row keeps enough bytes in flight to cover DRAM latency.
template <int V>
__device__ __forceinline__ void load_row_keys(const float* __restrict__ xr, uint32_t* __restrict__ keys, int S)
{
    if constexpr (V == 4) {
        const float4* __restrict__ xv = reinterpret_cast<const float4*>(xr);
        uint4* kv = reinterpret_cast<uint4*>(keys);
        const int nvec = S / 4;  // exact: this path runs only when S % 4 == 0
        for (int j0 = threadIdx.x; j0 < nvec; j0 += THREADS * LOAD_BATCH) {
            float4 v[LOAD_BATCH];
#pragma unroll
            for (int b = 0; b < LOAD_BATCH; ++b) {
                const int j = j0 + b * THREADS;
                if (j < nvec) v[b] = __ldg(xv + j);
            }
#pragma unroll
            for (int b = 0; b < LOAD_BATCH; ++b) {
                const int j = j0 + b * THREADS;
                if (j < nvec)
                    kv[j] = make_uint4(float_to_key(v[b].x), float_to_key(v[b].y), float_to_key(v[b].z),
                                       float_to_key(v[b].w));
            }
        }
    } else {
        for (int i0 = threadIdx.x; i0 < S; i0 += THREADS * LOAD_BATCH) {
            float v[LOAD_BATCH];
#pragma unroll
            for (int b = 0; b < LOAD_BATCH; ++b) {
                const int i = i0 + b * THREADS;
                if (i < S) v[b] = __ldg(xr + i);
            }
#pragma unroll
            for (int b = 0; b < LOAD_BATCH; ++b) {
                const int i = i0 + b * THREADS;
                if (i < S) keys[i] = float_to_key(v[b]);
            }
        }
    }
}

// ---- Row traversal (shared memory) ------------------------------------------------------------------
// Calls f(in, key, index) for every key a thread owns, in a fixed order: the 128-bit chunks t,
// t + THREADS, ... (components in order), then, for lanes of warp 0, one of the S % 4 tail keys.
// Every lane of a warp makes the same calls (`in` is false past the end), so f may use warp
// collectives. The keys buffer is 16-byte aligned whatever S is, so chunk reads are always 128-bit.
template <typename F>
__device__ __forceinline__ void for_each_key(const uint32_t* __restrict__ keys, int S, F&& f)
{
    const int lane = threadIdx.x & 31;
    const int warp_first = threadIdx.x - lane;
    const int nvec = S / VEC;
    const uint4* kv = reinterpret_cast<const uint4*>(keys);
    for (int base = warp_first; base < nvec; base += THREADS) {  // warp-uniform bound
        const int j = base + lane;
        const bool in = j < nvec;
        const uint4 k = in ? kv[j] : make_uint4(0u, 0u, 0u, 0u);
        f(in, k.x, 4 * j + 0);
        f(in, k.y, 4 * j + 1);
        f(in, k.z, 4 * j + 2);
        f(in, k.w, 4 * j + 3);
    }
    const int tail = S - nvec * VEC;
    if (tail != 0 && warp_first == 0) {
        const int i = nvec * VEC + lane;
        const bool in = lane < tail;
        f(in, in ? keys[i] : 0u, i);
    }
}

// ---- Histogram -----------------------------------------------------------------------------------------
// One shared-memory bin per digit value. Where the candidates of a warp share one digit (constant rows,
// ties, the crowded exponent bins of the first pass), one lane adds their count (a ballot and two
// redux.sync: a few instructions per key), so a row of equal values costs no more than a random one.
// The plain path is atomicAdd(+1), which sm_90 compiles to ATOMS.POPC.INC (the hardware may already
// merge same-address lanes there): WARP_AGGREGATE = 0 measures whether the software merge still pays.
__device__ __forceinline__ void histogram_add(unsigned* hist, bool candidate, unsigned digit)
{
    if constexpr (WARP_AGGREGATE != 0) {
        const unsigned active = __ballot_sync(FULL_MASK, candidate);
        if (active == 0u) return;  // warp-uniform
        const unsigned lo = __reduce_min_sync(FULL_MASK, candidate ? digit : 0xffffffffu);
        const unsigned hi = __reduce_max_sync(FULL_MASK, candidate ? digit : 0u);
        if (lo == hi) {  // warp-uniform
            if ((threadIdx.x & 31) == __ffs(active) - 1) atomicAdd(&hist[digit], __popc(active));
            return;
        }
    }
    if (candidate) atomicAdd(&hist[digit], 1u);
}

__device__ __forceinline__ void count_digits(const uint32_t* __restrict__ keys, int S, uint32_t prefix,
                                             uint32_t mask, int shift, unsigned* hist)
{
    for_each_key(keys, S, [&](bool in, uint32_t key, int) {
        const bool candidate = in && (key & mask) == prefix;
        histogram_add(hist, candidate, (key >> shift) & (RADIX_BINS - 1));
    });
}

// ---- Prefix scan and bucket selection (one warp) ------------------------------------------------------------
// Lane l owns BINS_PER_LANE consecutive bins, lane 0 the highest. A warp-shuffle inclusive scan of the lane
// totals gives every lane the count of candidates in higher bins; the lane whose bins straddle the k_left-th
// largest candidate writes the next state. The lanes zero their bins for the next pass.
__device__ __forceinline__ void select_bucket(unsigned* hist, SelectState* state, uint32_t prefix, uint32_t mask,
                                              int k_left, int shift)
{
    const int lane = threadIdx.x & 31;
    const int first = RADIX_BINS - (lane + 1) * BINS_PER_LANE;
    unsigned count[BINS_PER_LANE];
    unsigned lane_total = 0;
#pragma unroll
    for (int i = 0; i < BINS_PER_LANE; ++i) {
        count[i] = hist[first + i];
        hist[first + i] = 0u;
        lane_total += count[i];
    }
    unsigned above = lane_total;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const unsigned other = __shfl_up_sync(FULL_MASK, above, offset);
        if (lane >= offset) above += other;
    }
    above -= lane_total;  // candidates in the bins of lanes 0 .. lane-1 (all higher digits)
    const unsigned need = static_cast<unsigned>(k_left);
#pragma unroll
    for (int i = BINS_PER_LANE - 1; i >= 0; --i) {  // this lane's bins, highest first
        if (above < need && need <= above + count[i]) {
            const unsigned left = need - above;
            state->prefix = prefix | (static_cast<uint32_t>(first + i) << shift);
            state->mask = mask | (static_cast<uint32_t>(RADIX_BINS - 1) << shift);
            state->k_left = static_cast<int>(left);
            state->done = (left == count[i] || shift == 0) ? 1 : 0;
        }
        above += count[i];
    }
}

// ---- Radix select -------------------------------------------------------------------------------------------
// Digit passes over the keys in shared memory; returns the prefix (and its mask) that the K-th largest key
// has, and how many keys with that prefix the top K takes (every key above the prefix is taken).
__device__ __forceinline__ void radix_select(const uint32_t* __restrict__ keys, int S, int K, unsigned* hist,
                                             SelectState* state, uint32_t& prefix, uint32_t& mask, int& ties)
{
    prefix = 0u;
    mask = 0u;
    ties = K;
#pragma unroll 1
    for (int pass = 0; pass < RADIX_PASSES; ++pass) {
        const int shift = 32 - RADIX_BITS * (pass + 1);
        count_digits(keys, S, prefix, mask, shift, hist);
        __syncthreads();
        if (threadIdx.x < 32) select_bucket(hist, state, prefix, mask, ties, shift);
        __syncthreads();
        // Read by all before the selecting warp writes it again, which is after the next barrier.
        prefix = state->prefix;
        mask = state->mask;
        ties = state->k_left;
        if (state->done) break;  // block-uniform
    }
}

// ---- Block-wide exclusive scan ------------------------------------------------------------------------------
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned value, unsigned* warp_sums)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    unsigned inclusive = value;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const unsigned other = __shfl_up_sync(FULL_MASK, inclusive, offset);
        if (lane >= offset) inclusive += other;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        const unsigned total = lane < WARPS ? warp_sums[lane] : 0u;
        unsigned scanned = total;
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
            const unsigned other = __shfl_up_sync(FULL_MASK, scanned, offset);
            if (lane >= offset) scanned += other;
        }
        if (lane < WARPS) warp_sums[lane] = scanned - total;
    }
    __syncthreads();
    return warp_sums[warp] + inclusive - value;
}

// ---- Gather the selected keys ---------------------------------------------------------------------------------
// Keys above the prefix go to slots [0, K - ties) and the first `ties` keys equal to it (in traversal order)
// to [K - ties, K). Per thread the two counts travel packed in one word (above << 16 | equal): S < 65536 is
// implied by the shared-memory bound, so neither half carries into the other.
__device__ __forceinline__ void gather_selected(const uint32_t* __restrict__ keys, int S, int K, uint32_t prefix,
                                                uint32_t mask, int ties, unsigned long long* sel,
                                                unsigned* warp_sums)
{
    unsigned counts = 0;
    for_each_key(keys, S, [&](bool in, uint32_t key, int) {
        const uint32_t p = key & mask;
        if (in) counts += p > prefix ? (1u << 16) : (p == prefix ? 1u : 0u);
    });
    const unsigned offsets = block_exclusive_scan(counts, warp_sums);
    unsigned slot_above = offsets >> 16;
    unsigned tie_rank = offsets & 0xffffu;
    const unsigned first_tie_slot = static_cast<unsigned>(K - ties);
    const unsigned need = static_cast<unsigned>(ties);
    for_each_key(keys, S, [&](bool in, uint32_t key, int idx) {
        const uint32_t p = key & mask;
        if (!in) return;
        if (p > prefix) {
            sel[slot_above++] = pack(key, idx);
        } else if (p == prefix) {
            if (tie_rank < need) sel[first_tie_slot + tie_rank] = pack(key, idx);
            ++tie_rank;
        }
    });
}

// ---- Bitonic sort (descending) ---------------------------------------------------------------------------------
// Element e of the padded buffer belongs to thread e % THREADS, so the partner at stride j < 32 is lane ^ j.
__device__ __forceinline__ unsigned long long bitonic_exchange(unsigned long long v, int e, int k, int j)
{
    const unsigned long long other = __shfl_xor_sync(FULL_MASK, v, j);
    const bool lower = (e & j) == 0;
    const bool descending = (e & k) == 0;  // the final merge (k == size) is descending everywhere
    return lower == descending ? (v > other ? v : other) : (v < other ? v : other);
}

// Merge sizes k_lo .. k_hi, each with strides min(k/2, 16) .. 1, in registers; then a barrier.
__device__ __forceinline__ void bitonic_in_warps(unsigned long long* buf, int size, int k_lo, int k_hi)
{
    const int groups = size > THREADS ? size / THREADS : 1;
    for (int g = 0; g < groups; ++g) {
        const int e = g * THREADS + static_cast<int>(threadIdx.x);
        if ((e & ~31) >= size) continue;  // warp-uniform: the whole warp is past the end
        const bool in = e < size;
        unsigned long long v = in ? buf[e] : 0ull;
        for (int k = k_lo; k <= k_hi; k <<= 1)
            for (int j = min(k >> 1, WARP_SORT_STRIDES / 2); j > 0; j >>= 1) v = bitonic_exchange(v, e, k, j);
        if (in) buf[e] = v;
    }
    __syncthreads();
}

// One stride j >= 32 of merge size k in shared memory: each thread orders pairs (i, i + j).
__device__ __forceinline__ void bitonic_shared_step(unsigned long long* buf, int size, int k, int j)
{
    for (int p = threadIdx.x; p < size / 2; p += THREADS) {
        const int i = ((p & ~(j - 1)) << 1) | (p & (j - 1));
        const unsigned long long a = buf[i];
        const unsigned long long b = buf[i + j];
        const bool descending = (i & k) == 0;
        if (descending ? a < b : a > b) {
            buf[i] = b;
            buf[i + j] = a;
        }
    }
    __syncthreads();
}

__device__ __forceinline__ void bitonic_sort_desc(unsigned long long* buf, int size)
{
    bitonic_in_warps(buf, size, 2, min(size, WARP_SORT_STRIDES));
    for (int k = 2 * WARP_SORT_STRIDES; k <= size; k <<= 1) {
        for (int j = k >> 1; j >= WARP_SORT_STRIDES; j >>= 1) bitonic_shared_step(buf, size, k, j);
        bitonic_in_warps(buf, size, k, k);
    }
}

// ---- Store -------------------------------------------------------------------------------------------------
__device__ __forceinline__ void store_topk(const unsigned long long* buf, int K, float* __restrict__ vals,
                                           long long* __restrict__ idxs)
{
    for (int e = threadIdx.x; e < K; e += THREADS) {
        const unsigned long long c = buf[e];
        vals[e] = key_to_float(static_cast<uint32_t>(c >> 32));
        idxs[e] = static_cast<long long>(~static_cast<uint32_t>(c));
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
topk_radix_select(const float* __restrict__ x, float* __restrict__ values, long long* __restrict__ indices, int B,
                  int S, int K)
{
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned hist[RADIX_BINS];
    __shared__ unsigned warp_sums[WARPS];
    __shared__ SelectState state;

    const int row = blockIdx.x;
    if (row >= B) return;  // the whole block leaves together, before any barrier
    const float* xr = x + static_cast<size_t>(row) * S;  // 64-bit offsets: B * S may pass 2^31
    uint32_t* keys = reinterpret_cast<uint32_t*>(smem);
    unsigned long long* sel = reinterpret_cast<unsigned long long*>(smem + static_cast<size_t>((S + 3) & ~3) * 4);
    const int size = next_pow2(K);

    for (int i = threadIdx.x; i < RADIX_BINS; i += THREADS) hist[i] = 0u;

    // 1. Load (block-uniform choice of the vector width).
    if (S % VEC == 0 && (reinterpret_cast<uintptr_t>(xr) & 15u) == 0)
        load_row_keys<VEC>(xr, keys, S);
    else
        load_row_keys<1>(xr, keys, S);
    __syncthreads();

    // 2. Select.
    uint32_t prefix, mask;
    int ties;
    radix_select(keys, S, K, hist, &state, prefix, mask, ties);

    // 3. Gather (its scan's barriers order the traversal before any write to `sel`), then pad.
    gather_selected(keys, S, K, prefix, mask, ties, sel, warp_sums);
    for (int e = K + threadIdx.x; e < size; e += THREADS) sel[e] = 0ull;
    __syncthreads();

    // 4. Sort, 5. store.
    bitonic_sort_desc(sel, size);
    store_topk(sel, K, values + static_cast<size_t>(row) * K, indices + static_cast<size_t>(row) * K);
}
