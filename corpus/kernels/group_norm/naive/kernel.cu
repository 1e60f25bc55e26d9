// Group norm, the plain way: one block per (sample, group), three scalar passes over the group
// (mean, variance, write), each block-wide sum a shared-memory tree. The group is read three times.
//
// Sums are taken of x - pivot (the group's first element), not of x: a group far from zero
// would otherwise lose its deviations to rounding in the sum and in x - mean.

constexpr int THREADS = 256;  // a power of two, as the tree reduction needs
constexpr float EPS = 1e-5f;

__device__ float block_sum(float v, float* partial)
{
    const int tid = threadIdx.x;
    partial[tid] = v;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) partial[tid] += partial[tid + stride];
        __syncthreads();
    }
    const float total = partial[0];
    __syncthreads();  // every thread has read partial[0] before the next sum overwrites it
    return total;
}

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_naive(const float* x, const float* weight, const float* bias, float* y, int n, int c, int hw, int groups)
{
    __shared__ float partial[THREADS];
    const int group = blockIdx.x % groups;
    const int per_group = c / groups;                  // channels in a group
    const int len = per_group * hw;                    // elements in a group
    const size_t base = static_cast<size_t>(blockIdx.x) * len;
    const float pivot = x[base];

    float s = 0.0f;
    for (int e = threadIdx.x; e < len; e += THREADS) s += x[base + e] - pivot;
    const float d = block_sum(s, partial) / len;       // mean - pivot

    float q = 0.0f;
    for (int e = threadIdx.x; e < len; e += THREADS) {
        const float u = (x[base + e] - pivot) - d;
        q += u * u;
    }
    const float rstd = 1.0f / sqrtf(block_sum(q, partial) / len + EPS);

    for (int e = threadIdx.x; e < len; e += THREADS) {
        const int ch = group * per_group + e / hw;
        y[base + e] = ((x[base + e] - pivot) - d) * rstd * weight[ch] + bias[ch];
    }
}
