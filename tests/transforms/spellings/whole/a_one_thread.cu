// The sum of every element by the launch's one thread, stored through the pointer.
__global__ void whole(const float* __restrict__ x, float* __restrict__ out, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        sum += x[i];
    }
    *out = sum;
}
