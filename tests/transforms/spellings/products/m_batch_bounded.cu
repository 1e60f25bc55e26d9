// A 3-D tensor times one matrix (KernelBench's tensor-matrix product): the batch from grid z bounded beside the two
// bounds, B shared by every matrix of the batch.
__global__ void product(const float* A, const float* B, float* C, int batch, int M, int N, int K) {
    int b = blockIdx.z;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < batch && row < M && col < N) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++) sum += A[b * M * K + row * K + k] * B[k * N + col];
        C[b * M * N + row * N + col] = sum;
    }
}
