// Each operand's offset named by a local before the loop, the output's after it; B's terms column first.
__global__ void product(const float* A, const float* B, float* C, int batch, int M, int N, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int b = blockIdx.z;
    if (row < M && col < N) {
        float acc = 0.f;
        int a_off = b * M * K + row * K;
        int b_off = b * K * N + col;
        for (int k = 0; k < K; k++) {
            acc += A[a_off + k] * B[b_off + k * N];
        }
        int out = b * M * N + row * N + col;
        C[out] = acc;
    }
}
