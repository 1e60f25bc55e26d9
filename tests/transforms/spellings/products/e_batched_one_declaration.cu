// A batch of products whose indexes share one declaration, each matrix's rows offset before the row's own:
// A[(b * M + i) * K + k] rather than A[b * M * K + i * K + k].
__global__ void product(const float* A, const float* B, float* C, int batch, int M, int N, int K) {
    int b = blockIdx.z, i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M && j < N) {
        float s = 0.f;
        for (int k = 0; k < K; ++k) s += A[(b * M + i) * K + k] * B[(b * K + k) * N + j];
        C[(b * M + i) * N + j] = s;
    }
}
