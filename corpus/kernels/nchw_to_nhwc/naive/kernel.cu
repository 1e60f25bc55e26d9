// NCHW to NHWC, the plain way: one thread per output element. Writes are coalesced (consecutive
// threads, consecutive channels); the reads stride by hw floats between neighbouring threads.

constexpr int THREADS = 256;

extern "C" __global__ void __launch_bounds__(THREADS)
nchw_to_nhwc_naive(const float* x, float* y, int n, int c, int hw)
{
    const size_t total = static_cast<size_t>(n) * c * hw;
    const size_t i = static_cast<size_t>(blockIdx.x) * THREADS + threadIdx.x;
    if (i >= total) return;
    const int ch = static_cast<int>(i % c);
    const size_t rest = i / c;
    const int p = static_cast<int>(rest % hw);
    const size_t sample = rest / hw;
    y[i] = x[(sample * c + ch) * hw + p];
}
