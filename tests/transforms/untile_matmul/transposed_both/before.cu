// C[b] = A[b]^T B[b]^T for a batch of small matrices, one thread per output element, one layer of blocks per
// matrix: A is batch x K x M, B is batch x N x K, C is batch x M x N, all row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                       int N, int K) {
    __shared__ float tile_a[16][17];
    __shared__ float tile_b[16][17];
    int b = blockIdx.z;
    A += b * K * M;
    B += b * N * K;
    int c = blockIdx.x * 16 + threadIdx.x;
    int r = blockIdx.y * 16 + threadIdx.y;
    float acc = 0.0f;
    for (int tile_k = 0; tile_k < K; tile_k += 16) {
        tile_a[threadIdx.x][threadIdx.y] = tile_k + threadIdx.y < K && blockIdx.y * 16 + threadIdx.x < M ? A[(tile_k + threadIdx.y) * M + blockIdx.y * 16 + threadIdx.x] : 0.0f;
        tile_b[threadIdx.x][threadIdx.y] = tile_k + threadIdx.x < K && blockIdx.x * 16 + threadIdx.y < N ? B[(blockIdx.x * 16 + threadIdx.y) * K + tile_k + threadIdx.x] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16 && tile_k + k < K; ++k) acc = fmaf(tile_a[threadIdx.y][k], tile_b[k][threadIdx.x], acc);
        __syncthreads();
    }
    if (r < M && c < N) {
        C[b * M * N + r * N + c] = acc;
    }
}
