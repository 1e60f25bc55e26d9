// hist[h & 1023] += 1 for each hash h of keys: 1024 unsigned bins, the low ten bits of the hash.
__global__ void kernel(const unsigned int* keys, unsigned int* hist, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    __shared__ unsigned int s_hist[1024];
    for (int k = threadIdx.x; k < 1024; k += blockDim.x) s_hist[k] = 0;
    __syncthreads();
    if (i < n) {
        unsigned int h = keys[i] * 2654435761u;
        atomicAdd(&s_hist[h & 1023], 1u);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < 1024; k += blockDim.x) {
        if (s_hist[k] != 0) atomicAdd(&hist[k], s_hist[k]);
    }
}
