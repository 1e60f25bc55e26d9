// A row of blocks per output row (grid (cdiv(N, 256), M), block 256): the row is blockIdx.y, bounded by the launch
// alone, the column guarded on its own (a linear layer, B stored N x K as its weight).
__global__ void product(const float* A, const float* B, float* C, int M, int N, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[col * K + k];
        C[row * N + col] = acc > 0.0f ? acc : 0.01f * acc;
    }
}
