// A batch of products over 64-bit sizes (torch.bmm's operands): the batch from grid z held in an int64_t, each
// operand's rows offset inside the row's product.
#include <stdint.h>

__global__ void product(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
    int64_t b = blockIdx.z;
    int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += A[(b * M + r) * K + k] * B[(b * K + k) * N + c];
        C[(b * M + r) * N + c] = acc;
    }
}
