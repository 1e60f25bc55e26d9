// C = A B over 16-bit operands, each read through its conversion and summed in float.
#include <cuda_fp16.h>

__global__ void kernel(const __half* __restrict__ A, const __half* __restrict__ B, float* __restrict__ C, int M,
                       int N, int K) {
    __shared__ __half tile_a[16][16];
    __shared__ __half tile_b[16][16];
    int c = blockIdx.x * 16 + threadIdx.x;
    int r = blockIdx.y * 16 + threadIdx.y;
    float acc = 0.0f;
    for (int tile_k = 0; tile_k < K; tile_k += 16) {
        tile_a[threadIdx.y][threadIdx.x] = r < M && tile_k + threadIdx.x < K ? A[r * K + tile_k + threadIdx.x] : __half(0.0f);
        tile_b[threadIdx.y][threadIdx.x] = tile_k + threadIdx.y < K && c < N ? B[(tile_k + threadIdx.y) * N + c] : __half(0.0f);
        __syncthreads();
        for (int k = 0; k < 16 && tile_k + k < K; ++k) acc += __half2float(tile_a[threadIdx.y][k]) * __half2float(tile_b[k][threadIdx.x]);
        __syncthreads();
    }
    if (r < M && c < N) {
        C[r * N + c] = acc;
    }
}
