__global__ void product(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                        int N, int K) {
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i >= M * N) return;
    int c = i % N, r = i / N;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = fmaf(A[r * K + k], B[c * K + k], acc);
    C[i] = acc;
}
