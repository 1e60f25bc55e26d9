// The sum of squares in double on one thread, rounded to float once.
__global__ void whole(const float* x, float* out, int n) {
    double acc = 0.0;
    for (int i = 0; i < n; ++i) {
        const float v = x[i];
        acc += (double)v * v;
    }
    *out = (float)acc;
}
