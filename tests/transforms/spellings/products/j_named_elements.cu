// Each element named by a local before the product; the terms of each subscript in another order.
__global__ void product(const float* A, const float* B, float* C, int M, int N, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            const float a = A[k + K * row];
            const float b = B[col + k * N];
            sum += a * b;
        }
        C[row * N + col] = sum;
    }
}
