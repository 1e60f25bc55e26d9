// A running minimum from the row's end (torch.flip(torch.cummin(flip(x)))), the value first in the call.
__global__ void scan(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float m = INFINITY;
    for (int j = cols - 1; j >= 0; --j) {
        m = fminf(x[row * cols + j], m);
        y[row * cols + j] = m;
    }
}
