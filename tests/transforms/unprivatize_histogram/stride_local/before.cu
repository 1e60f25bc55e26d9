// hist[b] += 1 for every value b of x in [0, nbins), in a grid-stride loop (its stride a local); values outside the
// bins are not counted.
__global__ void kernel(const int* x, int* hist, int n, int nbins) {
    int stride = blockDim.x * gridDim.x;
    extern __shared__ int s_hist[];
    if (nbins > 0 && nbins <= 4096) {
        for (int k = threadIdx.x; k < nbins; k += blockDim.x) s_hist[k] = 0;
        __syncthreads();
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            int b = x[i];
            if (b >= 0 && b < nbins) atomicAdd(&s_hist[b], 1);
        }
        __syncthreads();
        for (int k = threadIdx.x; k < nbins; k += blockDim.x) {
            if (s_hist[k] != 0) atomicAdd(&hist[k], s_hist[k]);
        }
    } else for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int b = x[i];
        if (b >= 0 && b < nbins) atomicAdd(&hist[b], 1);
    }
}
