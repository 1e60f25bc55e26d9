// hist[v] += 1 for every byte v of x, in a grid-stride loop: each thread counts bytes a grid's width apart.
__global__ void kernel(const unsigned char* x, int* hist, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        unsigned char v = x[i];
        atomicAdd(&hist[v], 1);
    }
}
