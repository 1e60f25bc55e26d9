// The block's side named by a macro along both axes, as tiled tutorials write it before they tile.
#define TILE 16
__global__ void product(const float* A, const float* B, float* C, int M, int N, int K) {
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    if (row < M && col < N) {
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += A[row * K + k] * B[k * N + col];
        C[row * N + col] = sum;
    }
}
