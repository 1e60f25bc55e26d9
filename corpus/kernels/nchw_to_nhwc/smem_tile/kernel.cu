// NCHW to NHWC, tuned for a memory-bound GPU: each block moves one TILE x TILE tile of one sample
// (TILE channels x TILE positions) through shared memory, so that both the read (along positions)
// and the write (along channels) are coalesced. The tile is padded by one float per row: reading a
// column of it then touches TILE different banks instead of one.
//
// A block of TILE x ROWS threads covers the tile in TILE / ROWS steps, each thread with TILE / ROWS
// independent loads in flight. Edge tiles test every element against c and hw.

constexpr int TILE = 32;                    // channels and positions per tile
constexpr int ROWS = 8;                     // thread rows: each thread moves TILE / ROWS elements
constexpr int PAD = 1;                      // the bank-conflict padding of a tile row
constexpr int THREADS = TILE * ROWS;

extern "C" __global__ void __launch_bounds__(THREADS)
nchw_to_nhwc_smem_tile(const float* __restrict__ x, float* __restrict__ y, int n, int c, int hw)
{
    __shared__ float tile[TILE][TILE + PAD];
    const int p0 = blockIdx.x * TILE;        // first position of the tile
    const int c0 = blockIdx.y * TILE;        // first channel of the tile
    const size_t sample = blockIdx.z;
    const float* __restrict__ xs = x + sample * c * hw;
    float* __restrict__ ys = y + sample * c * hw;
    const int tx = threadIdx.x % TILE;
    const int ty = threadIdx.x / TILE;

    // Read: rows of the tile are channels, each a coalesced run of TILE positions.
#pragma unroll
    for (int r = ty; r < TILE; r += ROWS) {
        const int ch = c0 + r, p = p0 + tx;
        if (ch < c && p < hw) tile[r][tx] = __ldg(xs + static_cast<size_t>(ch) * hw + p);
    }
    __syncthreads();
    // Write: rows of the output are positions, each a coalesced run of TILE channels.
#pragma unroll
    for (int r = ty; r < TILE; r += ROWS) {
        const int p = p0 + r, ch = c0 + tx;
        if (ch < c && p < hw) ys[static_cast<size_t>(p) * c + ch] = tile[tx][r];
    }
}
