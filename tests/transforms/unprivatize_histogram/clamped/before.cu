// hist[b] += w[i], b the bin of x[i] among nbins equal bins of [lo, hi); values below or above it count in the
// first or the last bin.
__global__ void kernel(const float* x, const int* w, int* hist, float lo, float hi, int n, int nbins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    extern __shared__ int s_hist[];
    if (nbins > 0 && nbins <= 4096) {
        for (int k = threadIdx.x; k < nbins; k += blockDim.x) s_hist[k] = 0;
        __syncthreads();
        if (i < n) {
            int b = (int)((x[i] - lo) / (hi - lo) * nbins);
            b = min(max(b, 0), nbins - 1);
            atomicAdd(s_hist + b, w[i]);
        }
        __syncthreads();
        for (int k = threadIdx.x; k < nbins; k += blockDim.x) {
            if (s_hist[k] != 0) atomicAdd(&hist[k], s_hist[k]);
        }
    } else if (i < n) {
        int b = (int)((x[i] - lo) / (hi - lo) * nbins);
        b = min(max(b, 0), nbins - 1);
        atomicAdd(hist + b, w[i]);
    }
}
