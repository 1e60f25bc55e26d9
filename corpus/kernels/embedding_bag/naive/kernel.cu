// Embedding bag (sum), the plain way: one thread per output element, walking its bag's indices
// and adding one scalar of each gathered row.

#include <cstdint>

constexpr int THREADS = 256;

extern "C" __global__ void __launch_bounds__(THREADS)
embedding_bag_naive(const float* weight, const int64_t* indices, float* out, int bags, int bag, int d)
{
    const size_t i = static_cast<size_t>(blockIdx.x) * THREADS + threadIdx.x;
    if (i >= static_cast<size_t>(bags) * d) return;
    const size_t b = i / d;
    const int col = static_cast<int>(i % d);
    float acc = 0.0f;
    for (int l = 0; l < bag; ++l) acc += weight[indices[b * bag + l] * d + col];
    out[i] = acc;
}
