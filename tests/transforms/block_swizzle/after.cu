// Which tile each block computes: one block per 32 x 32 tile of an M x N output, grid = tiles_m * tiles_n.
constexpr int TILE = 32;
constexpr int GROUP_M = 4;  // tile rows per rasterization group

__device__ __forceinline__ void tile_coordinates(int block, int tiles_m, int tiles_n, int& tile_m, int& tile_n)
{
    tile_m = block / tiles_n;
    tile_n = block % tiles_n;
}

__global__ void kernel(int* owner, int M, int N)
{
    const int tiles_m = (M + TILE - 1) / TILE;
    const int tiles_n = (N + TILE - 1) / TILE;
    int tile_m, tile_n;
    tile_coordinates(blockIdx.x, tiles_m, tiles_n, tile_m, tile_n);
    if (threadIdx.x == 0) owner[tile_m * tiles_n + tile_n] = blockIdx.x;
}
