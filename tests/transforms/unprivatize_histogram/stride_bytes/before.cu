// hist[v] += 1 for every byte v of x, in a grid-stride loop: each thread counts bytes a grid's width apart.
__global__ void kernel(const unsigned char* x, int* hist, int n) {
    __shared__ int s_hist[256];
    for (int k = threadIdx.x; k < 256; k += blockDim.x) s_hist[k] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        unsigned char v = x[i];
        atomicAdd(&s_hist[v], 1);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < 256; k += blockDim.x) {
        if (s_hist[k] != 0) atomicAdd(&hist[k], s_hist[k]);
    }
}
