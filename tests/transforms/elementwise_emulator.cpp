// Elementwise and row kernels of the transform tests (tests/transforms/test_scalarize_half_packs.py,
// test_uncoarsen_grid_stride.py, test_serialize_reduction.py, test_untile_matmul.py, ...) run on the CPU: the kernel `kernel` of KERNEL_SOURCE, every CUDA thread a fiber
// (tests/mma_emulator.h), its arguments taken from the plan by the kernel's own parameter types (a pointer to
// float, double, int, long long, long (int64_t), __half, __nv_bfloat16 or unsigned char is a buffer of float32,
// float64, int32, int64, int64, float16, bfloat16 or uint8; a float scalar
// travels as the i32 of its bits). Usage: emulator <dir> <order> <seed> <shift>: every buffer argument starts
// <shift> elements into its buffer, so an odd shift makes every pointer of 16-bit data miss 16-byte alignment.
// __shfl_xor_sync exchanges a value of any type of at most 8 bytes (the header's takes a float), bits unchanged;
// __shfl_down_sync, __shfl_up_sync and __shfl_sync too, warp-wide.
// A shuffle whose mask names only some lanes (the lanes that share a column: serialize_column_reduction) waits for
// exactly those lanes; a lane that shuffles with a lane outside its mask, or whose mask names a lane that has left
// the kernel, is an error.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <tuple>
#include <type_traits>

#include "../mma_emulator.h"

#define __ldg(p) (*(p))

namespace row {

uint64_t exchanged[32][32];  // __shfl_xor_sync's exchange, per warp and lane

uint64_t written[32][32], taken[32][32];  // per warp and lane: partial-mask shuffles written to and read from

// Yield until every lane of `mask` in warp w has counted `round` in `count`.
void wait_for(int w, unsigned mask, uint64_t round, uint64_t (&count)[32][32])
{
    for (long spins = 0;; ++spins) {
        bool all = true;
        for (int k = 0; k < 32; ++k) {
            if (!(mask >> k & 1u) || count[w][k] >= round) continue;
            if (emu::fibers[w * 32 + k].state == emu::DONE)
                emu::die("warp %d: lane %d left the kernel before a shuffle with mask %#x", w, k, mask);
            all = false;
        }
        if (all) return;
        if (spins > 100000000) emu::die("warp %d: a shuffle with mask %#x never completes", w, mask);
        emu::cur->state = emu::READY;
        emu::yield();
    }
}

template <typename T> T shfl_xor(unsigned mask, T x, int offset)
{
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
    if (offset < 1 || offset > 31) emu::die("__shfl_xor_sync lane offset %d", offset);
    const int w = emu::cur->warp, l = emu::cur->lane;
    if (mask != 0xffffffffu) {
        if (!(mask >> l & 1u) || !(mask >> (l ^ offset) & 1u))
            emu::die("warp %d: lane %d shuffles with lane %d outside its mask %#x", w, l, l ^ offset, mask);
        std::memcpy(&exchanged[w][l], &x, sizeof(T));
        const uint64_t round = ++written[w][l];
        wait_for(w, mask, round, written);
        T y;
        std::memcpy(&y, &exchanged[w][l ^ offset], sizeof(T));
        ++taken[w][l];
        wait_for(w, mask, round, taken);  // every lane has read before any lane writes again
        return y;
    }
    std::memcpy(&exchanged[w][l], &x, sizeof(T));
    emu::collective(emu::SYNCWARP);  // every lane has written
    T y;
    std::memcpy(&y, &exchanged[w][l ^ offset], sizeof(T));
    emu::collective(emu::SYNCWARP);  // every lane has read before any lane writes again
    return y;
}

// A warp-wide shuffle in which lane l takes lane `source`'s value, or keeps its own where `source` is outside the
// warp (as CUDA returns it for __shfl_down_sync and __shfl_up_sync past the warp's ends).
template <typename T> T shfl_from(const char* name, unsigned mask, T x, int source)
{
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
    if (mask != 0xffffffffu) emu::die("%s with mask %#x (only warp-wide ones are emulated)", name, mask);
    const int w = emu::cur->warp;
    std::memcpy(&exchanged[w][emu::cur->lane], &x, sizeof(T));
    emu::collective(emu::SYNCWARP);  // every lane has written
    T y = x;
    if (source >= 0 && source < 32) std::memcpy(&y, &exchanged[w][source], sizeof(T));
    emu::collective(emu::SYNCWARP);  // every lane has read before any lane writes again
    return y;
}

template <typename T> T shfl_down(unsigned mask, T x, int offset)
{
    if (offset < 1 || offset > 31) emu::die("__shfl_down_sync lane offset %d", offset);
    return shfl_from("__shfl_down_sync", mask, x, emu::cur->lane + offset);
}

template <typename T> T shfl_up(unsigned mask, T x, int offset)
{
    if (offset < 1 || offset > 31) emu::die("__shfl_up_sync lane offset %d", offset);
    return shfl_from("__shfl_up_sync", mask, x, emu::cur->lane - offset);
}

template <typename T> T shfl(unsigned mask, T x, int lane) { return shfl_from("__shfl_sync", mask, x, lane & 31); }

// The emulated threads are fibers that switch only at a barrier or a shuffle, so a plain add is atomic; the old
// value is returned as CUDA's atomicAdd returns it. The order of the adds follows the fibers' run order.
template <typename T, typename V> T atomic_add(T* address, V value)
{
    const T old = *address;
    *address = old + T(value);
    return old;
}

// sm_90's vector atomicAdd: each component added (atomic per component on the GPU, as here).
inline float4 atomic_add(float4* address, float4 value)
{
    const float4 old = *address;
    *address = make_float4(old.x + value.x, old.y + value.y, old.z + value.z, old.w + value.w);
    return old;
}

// atomicMax and atomicMin: integers, as CUDA has them (the value converted to the element type first).
template <typename T, typename V> T atomic_max(T* address, V value)
{
    const T old = *address;
    if (old < T(value)) *address = T(value);
    return old;
}

template <typename T, typename V> T atomic_min(T* address, V value)
{
    const T old = *address;
    if (T(value) < old) *address = T(value);
    return old;
}

}  // namespace row

#undef __shfl_xor_sync
#define __shfl_xor_sync(mask, x, offset) row::shfl_xor(mask, x, offset)
#define __shfl_down_sync(mask, x, offset) row::shfl_down(mask, x, offset)
#define __shfl_up_sync(mask, x, offset) row::shfl_up(mask, x, offset)
#define __shfl_sync(mask, x, lane) row::shfl(mask, x, lane)
#define atomicAdd(address, value) row::atomic_add(address, value)
#define atomicMax(address, value) row::atomic_max(address, value)
#define atomicMin(address, value) row::atomic_min(address, value)

// A kernel's static `__shared__` array is one per block; blocks run one at a time here (tests/mma_emulator.h), so
// one function-static array, which every thread (fiber) of the block sees, serves. Host compilation would make it
// an ordinary local, one per thread.
#undef __shared__
#define __shared__ static

// CUDA's device library overloads max and min: float and double as fmaxf/fminf and fmax/fmin (a NaN operand gives
// the other), integers by comparison. Host C++ has only std::max and std::min, which kernels do not name.
inline float max(float a, float b) { return fmaxf(a, b); }
inline float min(float a, float b) { return fminf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline int max(int a, int b) { return a < b ? b : a; }
inline int min(int a, int b) { return b < a ? b : a; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline long long min(long long a, long long b) { return b < a ? b : a; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return b < a ? b : a; }
// A float's bits as an int (a device intrinsic: host code has none).
inline int __float_as_int(float v)
{
    int bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
}
// The bits of an int (or a long long) as a float (a double): how a kernel spells a quiet NaN without a header.
inline float __int_as_float(int bits)
{
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}
inline double __longlong_as_double(long long bits)
{
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}
// The device's float-to-int conversion rounded to the nearest even integer (cvt.rni): nearbyintf under the host's
// default rounding mode. The device saturates a value out of int's range and gives 0 for a NaN; the tests' values
// stay in range.
inline int __float2int_rn(float v) { return static_cast<int>(nearbyintf(v)); }

#include KERNEL_SOURCE

namespace {

int shift = 0;

size_t dtype_size(const std::string& name, const std::string& dtype)
{
    if (dtype == "float16" || dtype == "bfloat16") return 2;
    if (dtype == "float32" || dtype == "int32") return 4;
    if (dtype == "int64" || dtype == "float64") return 8;
    if (dtype == "uint8" || dtype == "bool") return 1;
    emu::die("unknown dtype %s for buffer %s", dtype.c_str(), name.c_str());
}

template <typename T> const char* dtype_of();
template <> const char* dtype_of<float>() { return "float32"; }
template <> const char* dtype_of<int>() { return "int32"; }
template <> const char* dtype_of<long long>() { return "int64"; }
template <> const char* dtype_of<long>() { return "int64"; }  // int64_t
template <> const char* dtype_of<double>() { return "float64"; }
template <> const char* dtype_of<__half>() { return "float16"; }
template <> const char* dtype_of<__nv_bfloat16>() { return "bfloat16"; }
template <> const char* dtype_of<unsigned char>() { return "uint8"; }
template <> const char* dtype_of<bool>() { return "bool"; }

template <typename T> struct Argument {  // a scalar
    static T get(emu::Plan& plan, const emu::Launch& l, size_t i)
    {
        const int bits = plan.i32(l, i);
        if constexpr (std::is_same_v<T, float>) {
            float value;
            std::memcpy(&value, &bits, 4);
            return value;
        } else {
            return T(bits);
        }
    }
};

template <typename T> struct Argument<T*> {  // a buffer
    static T* get(emu::Plan& plan, const emu::Launch& l, size_t i)
    {
        using Element = std::remove_const_t<T>;
        return static_cast<Element*>(plan.buffer(l, i, dtype_of<Element>())) + shift;
    }
};

template <typename... P> void run(void (*entry)(P...), emu::Plan& plan, const emu::Launch& l)
{
    size_t i = 0;
    const std::tuple<std::remove_cv_t<P>...> args{Argument<std::remove_cv_t<P>>::get(plan, l, i++)...};
    emu::launch(l.grid, l.block, l.shared, [=] { std::apply(entry, args); });
}

}  // namespace

#define ENTRY_TEXT(name) #name
#define ENTRY_NAME(name) ENTRY_TEXT(name)

int main(int argc, char** argv)
{
    if (argc != 5) emu::die("usage: %s <dir> <order> <seed> <shift>", argv[0]);
    emu::set_schedule(argv[2], argv[3], "eager");
    shift = std::atoi(argv[4]);
    emu::Plan plan(argv[1], dtype_size);
    for (const emu::Launch& l : plan.launches) {
        if (l.entry == "kernel")
            run(kernel, plan, l);
#ifdef SECOND_ENTRY  // a plan's second kernel (a split reduction's merge), named at the build
        else if (l.entry == ENTRY_NAME(SECOND_ENTRY))
            run(SECOND_ENTRY, plan, l);
#endif
        else
            emu::die("unknown entry %s", l.entry.c_str());
    }
    plan.finish();
    return 0;
}
