// A row of blocks per output row whose count the kernel is never told: the grid alone carries M (a linear layer, B
// stored N x K as its weight).
__global__ void product(const float* A, const float* B, float* C, int N, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[col * K + k];
    C[row * N + col] = acc;
}
