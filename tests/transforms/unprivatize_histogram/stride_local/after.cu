// hist[b] += 1 for every value b of x in [0, nbins), in a grid-stride loop (its stride a local); values outside the
// bins are not counted.
__global__ void kernel(const int* x, int* hist, int n, int nbins) {
    int stride = blockDim.x * gridDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int b = x[i];
        if (b >= 0 && b < nbins) atomicAdd(&hist[b], 1);
    }
}
