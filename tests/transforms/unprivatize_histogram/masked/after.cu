// hist[h & 1023] += 1 for each hash h of keys: 1024 unsigned bins, the low ten bits of the hash.
__global__ void kernel(const unsigned int* keys, unsigned int* hist, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int h = keys[i] * 2654435761u;
        atomicAdd(&hist[h & 1023], 1u);
    }
}
