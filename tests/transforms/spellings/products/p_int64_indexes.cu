// As PyTorch extensions write a linear layer: every index and size int64_t (a tensor's sizes), B stored N x K (the
// weight), leaving past the edges. The tiled form keeps the indexes' 64 bits.
#include <stdint.h>

__global__ void product(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int64_t M,
                        int64_t N, int64_t K) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t row = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) acc += A[row * K + k] * B[col * K + k];
    C[row * N + col] = acc / (1.0f + expf(-acc));
}
