// A grid-stride loop over the outputs on a fixed grid, each output's row and column split from its flat index (a
// linear layer, B stored N x K as its weight, with a SiLU).
__global__ void product(const float* A, const float* B, float* C, int M, int N, int K) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += blockDim.x * gridDim.x) {
        int r = i / N, c = i % N;
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[c * K + k];
        C[i] = acc / (1.0f + expf(-acc));
    }
}
