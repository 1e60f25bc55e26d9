// C = A^T B (torch.matmul(A.T, B)), one thread per output: A is K x M, B is K x N, both row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                       int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[k * M + r] * B[k * N + c];
        C[r * N + c] = acc;
    }
}
