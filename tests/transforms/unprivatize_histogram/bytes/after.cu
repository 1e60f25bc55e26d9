// hist[v] += 1 for every byte v of x: 256 bins, each byte a bin by its type.
__global__ void kernel(const unsigned char* x, int* hist, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&hist[x[i]], 1);
}
