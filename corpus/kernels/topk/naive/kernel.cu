// Top-k per row, the plain way: K rounds of a block-wide argmax.
//
// One block of THREADS threads per row. The row is copied once into shared memory as
// order-preserving uint32 keys (scalar loads); each round every thread finds the largest key it
// owns (threads stride over the row), a shared-memory tree reduction picks the block's largest
// (ties: the smallest index), one thread writes it out and marks the element taken by setting its
// key to 0, below every real key. So the K winners come out already sorted: value descending,
// index ascending among equal values. Cost is K * S comparisons per row: slow for large K, but
// every shape works (any S, K = 1 .. S) and nothing about the data is assumed.
//
// Keys: positives get the sign bit set, negatives have every bit flipped, so unsigned order is
// float order (-0.0 just below +0.0); -inf is 0x007FFFFF, so 0 is free to mean "taken" (only a
// NaN could map there, and the inputs hold none). The value written is the key turned back into a
// float: bit-exact, with no dependent global load inside the round.

#include <cstdint>

constexpr int THREADS = 1024;  // threads per block
constexpr int WARPS = THREADS / 32;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr uint32_t TAKEN = 0u;  // the key of an element already output

__device__ __forceinline__ uint32_t float_to_key(float f)
{
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_to_float(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Larger key first; among equal keys the smaller index.
__device__ __forceinline__ bool better(uint32_t ka, int ia, uint32_t kb, int ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

// The better of the warp's (key, index) pairs, in every lane.
__device__ __forceinline__ void warp_best(uint32_t& k, int& i)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const uint32_t ko = __shfl_xor_sync(FULL_MASK, k, offset);
        const int io = __shfl_xor_sync(FULL_MASK, i, offset);
        if (better(ko, io, k, i)) {
            k = ko;
            i = io;
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
topk_naive(const float* __restrict__ x, float* __restrict__ values, long long* __restrict__ indices, int B, int S,
           int K)
{
    extern __shared__ uint32_t keys[];  // S keys: the row
    __shared__ uint32_t best_key[WARPS];
    __shared__ int best_idx[WARPS];

    const int row = blockIdx.x;
    if (row >= B) return;  // the whole block leaves together, before any barrier
    const int tid = threadIdx.x;
    const float* xr = x + static_cast<size_t>(row) * S;  // 64-bit offsets
    float* vr = values + static_cast<size_t>(row) * K;
    long long* ir = indices + static_cast<size_t>(row) * K;

    for (int i = tid; i < S; i += THREADS) keys[i] = float_to_key(xr[i]);
    __syncthreads();

    for (int r = 0; r < K; ++r) {
        // This thread's best: it visits its elements in increasing index, so a strict > keeps the
        // smallest index among equal keys. A thread with no element offers (TAKEN, S), never chosen
        // while any element is left (and K <= S leaves one in every round).
        uint32_t bk = TAKEN;
        int bi = S;
        for (int i = tid; i < S; i += THREADS) {
            const uint32_t k = keys[i];
            if (k > bk) {
                bk = k;
                bi = i;
            }
        }
        warp_best(bk, bi);
        if ((tid & 31) == 0) {
            best_key[tid >> 5] = bk;
            best_idx[tid >> 5] = bi;
        }
        __syncthreads();
        if (tid < 32) {
            uint32_t k = tid < WARPS ? best_key[tid] : TAKEN;
            int i = tid < WARPS ? best_idx[tid] : S;
            warp_best(k, i);
            if (tid == 0) {
                vr[r] = key_to_float(k);
                ir[r] = i;
                keys[i] = TAKEN;
            }
        }
        __syncthreads();  // the mark is visible, and best_* free, before the next round
    }
}
