// C = the Euclidean distances between the rows of A (M x K) and the rows of B (N x K), one thread per pair.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                       int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += (A[r * K + k] - B[c * K + k]) * (A[r * K + k] - B[c * K + k]);
        C[r * N + c] = sqrtf(acc);
    }
}
