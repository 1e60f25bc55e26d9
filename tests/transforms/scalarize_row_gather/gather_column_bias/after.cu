// A gather plus a bias shared by every row (a position embedding): the row through the index, the bias at the column
// alone (a column broadcast); both are 16-byte packs where cols divides by four.
__global__ void kernel(const float* __restrict__ table, const int* __restrict__ idx, const float* __restrict__ bias,
                       float* __restrict__ out, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = i / cols, c = i % cols;
    out[i] = table[(long long)idx[r] * cols + c] + bias[c];
}
