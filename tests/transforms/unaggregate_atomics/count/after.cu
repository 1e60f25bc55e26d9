// count[0] += how many elements of x exceed the threshold: an integer add under a condition, to one place.
__global__ void kernel(const int* x, int* count, int threshold, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        if (x[i] > threshold) atomicAdd(&count[0], 1);
    }
}
