// Elementwise kernels of the transform tests (tests/transforms/test_scalarize_half_packs.py,
// test_uncoarsen_grid_stride.py) run on the CPU: the kernel `kernel` of KERNEL_SOURCE, every CUDA thread a fiber
// (tests/mma_emulator.h), its arguments taken from the plan by the kernel's own parameter types (a pointer to
// float, int, __half or __nv_bfloat16 is a buffer of float32, int32, float16 or bfloat16; a float scalar
// travels as the i32 of its bits). Usage: emulator <dir> <order> <seed> <shift>: every buffer argument starts
// <shift> elements into its buffer, so an odd shift makes every pointer of 16-bit data miss 16-byte alignment.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <tuple>
#include <type_traits>

#include "../mma_emulator.h"

#define __ldg(p) (*(p))

#include KERNEL_SOURCE

namespace {

int shift = 0;

size_t dtype_size(const std::string& name, const std::string& dtype)
{
    if (dtype == "float16" || dtype == "bfloat16") return 2;
    if (dtype == "float32" || dtype == "int32") return 4;
    emu::die("unknown dtype %s for buffer %s", dtype.c_str(), name.c_str());
}

template <typename T> const char* dtype_of();
template <> const char* dtype_of<float>() { return "float32"; }
template <> const char* dtype_of<int>() { return "int32"; }
template <> const char* dtype_of<__half>() { return "float16"; }
template <> const char* dtype_of<__nv_bfloat16>() { return "bfloat16"; }

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

int main(int argc, char** argv)
{
    if (argc != 5) emu::die("usage: %s <dir> <order> <seed> <shift>", argv[0]);
    emu::set_schedule(argv[2], argv[3], "eager");
    shift = std::atoi(argv[4]);
    emu::Plan plan(argv[1], dtype_size);
    for (const emu::Launch& l : plan.launches) {
        if (l.entry != "kernel") emu::die("unknown entry %s", l.entry.c_str());
        run(kernel, plan, l);
    }
    plan.finish();
    return 0;
}
