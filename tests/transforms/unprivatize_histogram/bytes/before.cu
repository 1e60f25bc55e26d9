// hist[v] += 1 for every byte v of x: 256 bins, each byte a bin by its type.
__global__ void kernel(const unsigned char* x, int* hist, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    __shared__ int s_hist[256];
    for (int k = threadIdx.x; k < 256; k += blockDim.x) s_hist[k] = 0;
    __syncthreads();
    if (i < n) atomicAdd(&s_hist[x[i]], 1);
    __syncthreads();
    for (int k = threadIdx.x; k < 256; k += blockDim.x) {
        if (s_hist[k] != 0) atomicAdd(&hist[k], s_hist[k]);
    }
}
