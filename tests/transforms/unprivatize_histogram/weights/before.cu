constexpr int CLASSES = 64;

// hist[c] += w[i] for each label c = labels[i] in [0, CLASSES): a float weight per element.
__global__ void kernel(const int* labels, const float* w, float* hist, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    __shared__ float s_hist[CLASSES];
    for (int k = threadIdx.x; k < CLASSES; k += blockDim.x) s_hist[k] = 0;
    __syncthreads();
    if (i < n) {
        int c = labels[i];
        if (c >= 0 && c < CLASSES) atomicAdd(&s_hist[c], w[i]);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < CLASSES; k += blockDim.x) {
        if (s_hist[k] != 0) atomicAdd(&hist[k], s_hist[k]);
    }
}
