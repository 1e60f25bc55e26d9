// size_t indexes and sizes, the thread's row of A named by a local pointer, the update fused, a relu after: every
// use of an index is a subscript or a comparison, where unsigned and signed 64-bit arithmetic agree.
__global__ void product(const float* A, const float* B, float* C, size_t M, size_t N, size_t K) {
    size_t n = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t m = (size_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (m < M && n < N) {
        const float* a = A + m * K;
        float s = 0.0f;
        for (size_t k = 0; k < K; k++) s = fmaf(a[k], B[k * N + n], s);
        C[m * N + n] = fmaxf(s, 0.0f);
    }
}
