// SGD with Nesterov momentum, the plain way: one thread per element, scalar loads and stores.

constexpr int THREADS = 256;
constexpr float LR = 0.01f;
constexpr float MOMENTUM = 0.9f;
constexpr float WEIGHT_DECAY = 1e-4f;

extern "C" __global__ void __launch_bounds__(THREADS)
sgd_nesterov_naive(const float* p, const float* g, const float* buf, float* p_new, float* buf_new, int n)
{
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= n) return;
    const float d = g[i] + WEIGHT_DECAY * p[i];
    const float b = MOMENTUM * buf[i] + d;
    buf_new[i] = b;
    p_new[i] = p[i] - LR * (d + MOMENTUM * b);
}
