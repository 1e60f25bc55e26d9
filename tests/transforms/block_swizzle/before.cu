// Which tile each block computes: one block per 32 x 32 tile of an M x N output, grid = tiles_m * tiles_n.
constexpr int TILE = 32;
constexpr int GROUP_M = 4;  // tile rows per rasterization group

__device__ __forceinline__ void tile_coordinates(int block, int tiles_m, int tiles_n, int& tile_m, int& tile_n)
{
    const int per_group = GROUP_M * tiles_n;
    const int group = block / per_group;
    const int first_m = group * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    const int in_group = block - group * per_group;
    tile_m = first_m + in_group % rows;
    tile_n = in_group / rows;
}

__global__ void kernel(int* owner, int M, int N)
{
    const int tiles_m = (M + TILE - 1) / TILE;
    const int tiles_n = (N + TILE - 1) / TILE;
    int tile_m, tile_n;
    tile_coordinates(blockIdx.x, tiles_m, tiles_n, tile_m, tile_n);
    if (threadIdx.x == 0) owner[tile_m * tiles_n + tile_n] = blockIdx.x;
}
