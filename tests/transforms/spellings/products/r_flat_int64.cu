// A flat product over 64-bit sizes: the index, its row and column and k all int64_t, the guard an early return.
#include <stdint.h>

__global__ void product(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    int64_t r = i / N;
    int64_t c = i % N;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + c];
    C[i] = tanhf(acc);
}
