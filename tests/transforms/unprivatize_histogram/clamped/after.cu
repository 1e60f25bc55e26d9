// hist[b] += w[i], b the bin of x[i] among nbins equal bins of [lo, hi); values below or above it count in the
// first or the last bin.
__global__ void kernel(const float* x, const int* w, int* hist, float lo, float hi, int n, int nbins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int b = (int)((x[i] - lo) / (hi - lo) * nbins);
        b = min(max(b, 0), nbins - 1);
        atomicAdd(hist + b, w[i]);
    }
}
