// y = A x for a rows x n matrix, one block per row. The block's dynamic shared bytes are carved into
// two float views: a tile of x, staged once per pass and read by every thread, and the partial sums
// of the final reduction.

constexpr int THREADS = 128;
constexpr int TILE = 256;                     // x elements staged per pass
constexpr int OFF_X = 0;                      // x tile    [TILE] float
constexpr int OFF_SUM = OFF_X + TILE * 4;     // partials  [THREADS] float
constexpr int SMEM_BYTES = OFF_SUM + THREADS * 4;

extern "C" __global__ void kernel(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y,
                                  int rows, int n)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float* x_s = reinterpret_cast<float*>(smem + OFF_X);
    float* sum_s = reinterpret_cast<float*>(smem + OFF_SUM);
    const int row = blockIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < n; k0 += TILE) {
        for (int i = threadIdx.x; i < TILE; i += THREADS)
            x_s[i] = k0 + i < n ? x[k0 + i] : 0.0f;
        __syncthreads();
        for (int i = threadIdx.x; i < TILE && k0 + i < n; i += THREADS)
            acc += a[static_cast<long long>(row) * n + k0 + i] * x_s[i];
        __syncthreads();
    }
    sum_s[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int t = 0; t < THREADS; ++t) total += sum_s[t];
        y[row] = total;
    }
}
