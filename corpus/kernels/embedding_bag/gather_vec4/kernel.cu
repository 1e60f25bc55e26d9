// Embedding bag (sum), tuned for a memory-bound GPU: one block per bag. The bag's indices are staged
// in shared memory (THREADS at a time, one load each instead of one per thread), then each thread
// sums one float4 column slice of every gathered row, UNROLL rows in flight, in bag order.
//
// float4 needs d % 4 == 0 (every table and output row then starts 16-byte aligned); other widths take
// the scalar (V = 1) instantiation. Rows wider than THREADS vectors are covered in column chunks.

#include <cstdint>

constexpr int THREADS = 128;
constexpr int UNROLL = 4;             // gathered rows in flight per thread

template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; };
template <> struct VecOf<4> { using type = float4; };

__device__ __forceinline__ void add(float& a, float b) { a += b; }
__device__ __forceinline__ void add(float4& a, const float4& b) { a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w; }

template <typename Vec> __device__ __forceinline__ Vec zero();
template <> __device__ __forceinline__ float zero<float>() { return 0.0f; }
template <> __device__ __forceinline__ float4 zero<float4>() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

template <int V>
__device__ __forceinline__ void bag_sum(const float* __restrict__ weight, const int64_t* __restrict__ ib,
                                        float* __restrict__ ob, int bag, int d, int64_t* __restrict__ idx)
{
    using Vec = typename VecOf<V>::type;
    const Vec* __restrict__ wv = reinterpret_cast<const Vec*>(weight);
    Vec* __restrict__ ov = reinterpret_cast<Vec*>(ob);
    const int n = d / V;  // vectors per row (exact: V == 4 only when d % 4 == 0)
    const int tid = threadIdx.x;

    for (int j0 = 0; j0 < n; j0 += THREADS) {  // column chunks: block-uniform trip count
        const int j = j0 + tid;
        Vec acc = zero<Vec>();
        for (int l0 = 0; l0 < bag; l0 += THREADS) {
            const int count = min(THREADS, bag - l0);
            __syncthreads();  // the previous chunk of indices is no longer read
            if (tid < count) idx[tid] = __ldg(ib + l0 + tid);
            __syncthreads();
            if (j < n) {
                int l = 0;
                for (; l + UNROLL <= count; l += UNROLL) {
                    Vec v[UNROLL];
#pragma unroll
                    for (int u = 0; u < UNROLL; ++u) v[u] = __ldg(wv + idx[l + u] * n + j);
#pragma unroll
                    for (int u = 0; u < UNROLL; ++u) add(acc, v[u]);
                }
                for (; l < count; ++l) add(acc, __ldg(wv + idx[l] * n + j));
            }
        }
        if (j < n) ov[j] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
embedding_bag_gather_vec4(const float* __restrict__ weight, const int64_t* __restrict__ indices,
                          float* __restrict__ out, int bags, int bag, int d)
{
    __shared__ int64_t idx[THREADS];
    const int64_t* ib = indices + static_cast<size_t>(blockIdx.x) * bag;
    float* ob = out + static_cast<size_t>(blockIdx.x) * d;
    if (d % 4 == 0)  // block-uniform: both instantiations reach the same barriers
        bag_sum<4>(weight, ib, ob, bag, d, idx);
    else
        bag_sum<1>(weight, ib, ob, bag, d, idx);
}
