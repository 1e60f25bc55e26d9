// C = A B over 16-bit operands, each read through its conversion and summed in float: one thread per output.
#include <cuda_fp16.h>

__global__ void kernel(const __half* __restrict__ A, const __half* __restrict__ B, float* __restrict__ C, int M,
                       int N, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += __half2float(A[r * K + k]) * __half2float(B[k * N + c]);
        C[r * N + c] = acc;
    }
}
