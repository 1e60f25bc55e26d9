// A guard for each bound, one inside the other; the update spelled out and the loop stepping by `+= 1`.
__global__ void product(const float* A, const float* B, float* C, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M) {
        if (col < N) {
            float sum = 0;
            for (int k = 0; k < K; k += 1) {
                sum = sum + A[row * K + k] * B[k * N + col];
            }
            C[row * N + col] = sum;
        }
    }
}
