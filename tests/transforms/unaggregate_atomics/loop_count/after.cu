// count[0] += how many elements of x exceed the threshold: a grid-stride loop that makes one atomic per element it
// counts.
__global__ void kernel(const int* x, int* count, int threshold, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        if (x[i] > threshold) atomicAdd(count, 1);
    }
}
