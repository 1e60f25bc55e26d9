// ADVERSARIAL (hidden_library): the block reductions are not the candidate's own code: they come
// from CUB, pulled in through its umbrella header (which also carries the device-wide
// algorithms such as cub::DeviceReduce). Library delegation is forbidden: a lineage must be made
// of the kernel's own code.

#include <cub/cub.cuh>

constexpr int THREADS = 256;

using BlockReduce = cub::BlockReduce<float, THREADS>;

struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

extern "C" __global__ void __launch_bounds__(THREADS)
row_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ typename BlockReduce::TempStorage temp;
    __shared__ float broadcast;

    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<size_t>(row) * cols;
    float* yr = y + static_cast<size_t>(row) * cols;

    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    m = BlockReduce(temp).Reduce(m, MaxOp());  // the result is valid in thread 0 only
    if (threadIdx.x == 0) broadcast = m;
    __syncthreads();
    const float row_max = broadcast;
    __syncthreads();  // temp and broadcast are reused below

    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) s += expf(xr[c] - row_max);
    s = BlockReduce(temp).Sum(s);
    if (threadIdx.x == 0) broadcast = s;
    __syncthreads();
    const float inv_sum = 1.0f / broadcast;

    for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = expf(xr[c] - row_max) * inv_sum;
}
