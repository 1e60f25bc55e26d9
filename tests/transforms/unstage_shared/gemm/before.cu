// A 2-D tiled GEMM, C = A B (row-major, M x K times K x N), one TILE x TILE output tile per block
// of TILE x TILE threads: both operand tiles are staged in shared memory per K step.
constexpr int TILE = 16;

__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                       int N, int K)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        As[ty][tx] = A[row * K + t + tx];
        Bs[ty][tx] = B[(t + ty) * N + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    C[row * N + col] = acc;
}
