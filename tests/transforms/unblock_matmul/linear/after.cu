// y = x W^T + b (a linear layer): x is M x K, W is N x K, both row-major.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                       float* __restrict__ y, int M, int N, int K) {
    __shared__ float tile_a[16][16];
    __shared__ float tile_b[16][17];
    int c = blockIdx.x * 16 + threadIdx.x;
    int r = blockIdx.y * 16 + threadIdx.y;
    float acc = 0.0f;
    for (int tile_k = 0; tile_k < K; tile_k += 16) {
        tile_a[threadIdx.y][threadIdx.x] = r < M && tile_k + threadIdx.x < K ? x[r * K + tile_k + threadIdx.x] : 0.0f;
        tile_b[threadIdx.x][threadIdx.y] = tile_k + threadIdx.x < K && blockIdx.x * 16 + threadIdx.y < N ? w[(blockIdx.x * 16 + threadIdx.y) * K + tile_k + threadIdx.x] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16 && tile_k + k < K; ++k) acc += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];
        __syncthreads();
    }
    if (r < M && c < N) {
        y[r * N + c] = acc + b[c];
    }
}
