// A transpose through a 2-D shared tile padded in its declared row extent.
constexpr int TILE = 32;

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[TILE][TILE];
    const int r = threadIdx.x / TILE;
    const int c = threadIdx.x % TILE;
    for (int k = 0; k < TILE; k += 4) tile[r + k][c] = x[(r + k) * TILE + c];
    __syncthreads();
    for (int k = 0; k < TILE; k += 4) y[(r + k) * TILE + c] = tile[c][r + k];
}
