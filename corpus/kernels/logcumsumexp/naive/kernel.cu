// Log-cumulative-sum-exp, the plain way: one thread per row, a sequential scan with the accurate
// exp and log1p. Neighbouring threads read different rows (strided, uncoalesced accesses).
// The running value is a double: in fp32 a row offset by hundreds stops growing once each new term
// adds less than half an ulp of the running value (long rows would end far from the answer).

constexpr int THREADS = 128;

extern "C" __global__ void __launch_bounds__(THREADS)
logcumsumexp_naive(const float* x, float* y, int rows, int cols)
{
    const int row = blockIdx.x * THREADS + threadIdx.x;
    if (row >= rows) return;
    const float* xr = x + static_cast<size_t>(row) * cols;
    float* yr = y + static_cast<size_t>(row) * cols;
    double acc = xr[0];
    yr[0] = xr[0];
    for (int c = 1; c < cols; ++c) {
        const double v = xr[c];
        const double m = fmax(acc, v);
        acc = m + log1p(exp(-fabs(acc - v)));
        yr[c] = static_cast<float>(acc);
    }
}
