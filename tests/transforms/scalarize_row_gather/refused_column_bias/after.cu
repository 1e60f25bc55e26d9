// A gather plus a bias shared by every row (a position embedding): bias[c] names the column alone, a place the
// analysis cannot show to start a 16-byte block of its own, so scalarize_row_gather must refuse and say why.
__global__ void kernel(const float* __restrict__ table, const int* __restrict__ idx, const float* __restrict__ bias,
                       float* __restrict__ out, int rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    int r = i / cols, c = i % cols;
    out[i] = table[(long long)idx[r] * cols + c] + bias[c];
}
