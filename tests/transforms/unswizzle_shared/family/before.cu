// A swizzle family (as in the mma.sync GEMM): the writer's helper computes the phase from the row,
// the reader's helper uses a per-lane phase precomputed in a struct. Both XORs are one layout.
#include <cstdint>

constexpr int ROWS = 32;
constexpr int ROW_BYTES = 128;
constexpr int CHUNK_BYTES = 16;
constexpr int SWIZZLE_ROWS = 8;

__device__ __forceinline__ uint32_t swizzle_offset(int row, int chunk)
{
    return static_cast<uint32_t>(row * ROW_BYTES + ((chunk ^ (row % SWIZZLE_ROWS)) * CHUNK_BYTES));
}

struct LaneAddressing {
    uint32_t row;  // byte offset of this lane's row
    int phase;     // row % 8
};

__device__ __forceinline__ LaneAddressing make_lane_addressing(int lane)
{
    LaneAddressing la;
    la.row = static_cast<uint32_t>(lane * ROW_BYTES);
    la.phase = lane % SWIZZLE_ROWS;
    return la;
}

__device__ __forceinline__ uint32_t read_offset(const LaneAddressing& la, int chunk)
{
    return la.row + static_cast<uint32_t>((chunk ^ la.phase) * CHUNK_BYTES);
}

__global__ void kernel(const uint4* __restrict__ x, uint4* __restrict__ y)
{
    __shared__ __align__(16) unsigned char tile[ROWS * ROW_BYTES];
    const int t = threadIdx.x;
    for (int i = 0; i < 2; ++i) {
        const int id = t + 128 * i;
        *reinterpret_cast<uint4*>(tile + swizzle_offset(id / 8, id % 8)) = x[id];
    }
    __syncthreads();
    const LaneAddressing la = make_lane_addressing(t % ROWS);
    for (int chunk = t / ROWS; chunk < 8; chunk += 4)
        y[chunk * ROWS + t % ROWS] = *reinterpret_cast<const uint4*>(tile + read_offset(la, chunk));
}
