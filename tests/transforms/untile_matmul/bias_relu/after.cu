// C = relu(alpha * A B + bias), one thread per output element: A is M x K, B is K x N, row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
                       float* __restrict__ C, int M, int N, int K, float alpha) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + c];
        float v = alpha * acc + bias[c];
        C[r * N + c] = v > 0.0f ? v : 0.0f;
    }
}
