constexpr int CLASSES = 64;

// hist[c] += w[i] for each label c = labels[i] in [0, CLASSES): a float weight per element.
__global__ void kernel(const int* labels, const float* w, float* hist, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int c = labels[i];
        if (c >= 0 && c < CLASSES) atomicAdd(&hist[c], w[i]);
    }
}
