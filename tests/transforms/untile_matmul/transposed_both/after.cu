// C[b] = A[b]^T B[b]^T for a batch of small matrices, one thread per output element, one layer of blocks per
// matrix: A is batch x K x M, B is batch x N x K, C is batch x M x N, all row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                       int N, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    int b = blockIdx.z;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc = fmaf(A[b * K * M + k * M + r], B[b * N * K + c * K + k], acc);
        C[b * M * N + r * N + c] = acc;
    }
}
