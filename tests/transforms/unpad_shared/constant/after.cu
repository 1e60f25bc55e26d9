// A transpose through a shared tile whose rows are padded by one float, named as a stride constant:
// the column-wise reads of the second loop then hit 32 different banks.
constexpr int TILE = 32;
constexpr int PAD = 1;
constexpr int STRIDE = TILE;

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[TILE * STRIDE];
    const int r = threadIdx.x / TILE;
    const int c = threadIdx.x % TILE;
    for (int k = 0; k < TILE; k += 4) tile[(r + k) * STRIDE + c] = x[(r + k) * TILE + c];
    __syncthreads();
    for (int k = 0; k < TILE; k += 4) y[(r + k) * TILE + c] = tile[c * STRIDE + r + k];
}
