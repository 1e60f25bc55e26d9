// Row softmax, the plain way: one thread block per row, three passes over the row
// (max, sum of exponentials, write), each block-wide reduction a shared-memory tree.
//
// Scalar loads, no vectorisation, no register caching: the row is read from global memory three
// times. Correct for every shape: threads stride over the columns, so any width works, and a row
// narrower than the block simply leaves threads idle (they contribute the identity: -inf or 0).

constexpr int THREADS = 256;  // threads per block; a power of two, as the tree reduction needs

extern "C" __global__ void __launch_bounds__(THREADS)
row_softmax_naive(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float partial[THREADS];

    const int row = blockIdx.x;
    if (row >= rows) return;  // the whole block leaves together, before any barrier
    const int tid = threadIdx.x;
    // 64-bit row offset: rows * cols can exceed what a 32-bit index holds for larger problems.
    const float* xr = x + static_cast<size_t>(row) * cols;
    float* yr = y + static_cast<size_t>(row) * cols;

    // Pass 1: the row maximum.
    float m = -INFINITY;
    for (int c = tid; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    partial[tid] = m;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) partial[tid] = fmaxf(partial[tid], partial[tid + stride]);
        __syncthreads();
    }
    const float row_max = partial[0];
    __syncthreads();  // every thread has read partial[0] before pass 2 overwrites it

    // Pass 2: the sum of exp(x - max). Subtracting the max keeps every exponent <= 0: no overflow.
    float s = 0.0f;
    for (int c = tid; c < cols; c += THREADS) s += expf(xr[c] - row_max);
    partial[tid] = s;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride >>= 1) {
        if (tid < stride) partial[tid] += partial[tid + stride];
        __syncthreads();
    }
    const float inv_sum = 1.0f / partial[0];  // >= 1 term equals exp(0) = 1, so never 0

    // Pass 3: normalise and write.
    for (int c = tid; c < cols; c += THREADS) yr[c] = expf(xr[c] - row_max) * inv_sum;
}
