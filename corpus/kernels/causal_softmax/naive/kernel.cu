// Scaled causal softmax, the plain way: one block per row (one query of one map), three scalar
// passes over all sk keys (max, sum of exponentials, write), testing the mask on every element, each
// block-wide reduction a shared-memory tree.

constexpr int THREADS = 128;  // a power of two, as the tree reduction needs

extern "C" __global__ void __launch_bounds__(THREADS)
causal_softmax_naive(const float* x, float* y, int bh, int sq, int sk, float scale)
{
    __shared__ float partial[THREADS];
    const int tid = threadIdx.x;
    const int query = blockIdx.x % sq;
    const int last_key = query + (sk - sq);  // keys 0 .. last_key are visible
    const float* xr = x + static_cast<size_t>(blockIdx.x) * sk;
    float* yr = y + static_cast<size_t>(blockIdx.x) * sk;

    float m = -INFINITY;
    for (int k = tid; k < sk; k += THREADS)
        if (k <= last_key) m = fmaxf(m, xr[k] * scale);
    partial[tid] = m;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) partial[tid] = fmaxf(partial[tid], partial[tid + stride]);
        __syncthreads();
    }
    const float row_max = partial[0];
    __syncthreads();

    float s = 0.0f;
    for (int k = tid; k < sk; k += THREADS)
        if (k <= last_key) s += expf(xr[k] * scale - row_max);
    partial[tid] = s;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) partial[tid] += partial[tid + stride];
        __syncthreads();
    }
    const float inv_sum = 1.0f / partial[0];

    for (int k = tid; k < sk; k += THREADS) yr[k] = k <= last_key ? expf(xr[k] * scale - row_max) * inv_sum : 0.0f;
}
