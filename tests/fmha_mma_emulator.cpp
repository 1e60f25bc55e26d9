// Runs an fmha mma.sync kernel's source (fmha/flash_mma_r32, or fmha/flash_mma: the same PTX wrappers
// and entry signature) on the CPU: every CUDA thread of a CTA is a fiber (ucontext), CTAs run one after
// another, and the PTX the kernel wraps (ldmatrix, ldmatrix.trans, mma.sync m16n8k16 f16 -> f32,
// cp.async with its commit groups and wait_group N) is emulated as the PTX ISA defines it, as are the
// warp shuffles and __syncwarp (tests/mma_emulator.h). tests/test_corpus_fmha_r32.py builds it with the
// kernel's source, minus its PTX wrappers, spliced in at KERNEL_SOURCE, and the entry named by
// KERNEL_ENTRY.
//
// What it checks besides the numbers: warp-collective operations reached by all 32 lanes together and
// the same one (a shuffle by every lane of the mask, with one lane offset); __syncthreads reached by
// every thread (a deadlock is an error); ldmatrix and cp.async addresses 16-byte aligned and inside the
// launch's dynamic shared memory; cp.async sources inside an input buffer (a zero-fill copy may point
// anywhere valid, as the kernel's do: at the start of the tensor); every cp.async committed and waited
// for by the end; nothing written past the shared memory the plan asks for or outside any global
// buffer (guards); shared memory starts as NaN in every CTA. Races show up as results that change with
// the schedule: threads run in forward, reverse or seeded random order between blocking points, or one
// warp at a time, and cp.async copies land either when issued (eager) or only when their thread's
// wait_group retires their group (late).
//
// The shared window: __cvta_generic_to_shared of the dynamic shared memory gives <window base> + offset;
// the base is 1024 (what `.align 1024` promises) unless the command line says otherwise, so a run with
// a base that is not a multiple of 256 shows what a kernel assumes about it.
//
//   fmha_mma_emulator <dir> <order: forward|reverse|random|warps|warps_reverse> <seed> <copies: eager|late> [base]
// reads <dir>/plan.txt and the inputs <dir>/<name>.bin, writes the outputs as <dir>/<name>.bin; exits 1
// with a message on stderr when a check fails.
#include <cuda_runtime.h>
#include <cuda_fp16.h>

#define EMU_SMEM_ALIGN 1024
#include "mma_emulator.h"

// ---- the kernel's PTX wrappers, emulated ------------------------------------------------------------
__forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, int src_bytes)
{
    unsigned char* dst = emu::shared_at(smem_addr, 16, "cp.async destination");
    if (src_bytes != 0 && src_bytes != 16)
        emu::die("cp.async src-size %d (the kernel copies 16 or 0 bytes)", src_bytes);
    const unsigned char* src = static_cast<const unsigned char*>(gmem);
    if (reinterpret_cast<uintptr_t>(src) % 16) emu::die("cp.async source %p is not 16-byte aligned", gmem);
    bool inside = false;
    for (const auto& [start, bytes] : emu::inputs) inside = inside || (src >= start && src + 16 <= start + bytes);
    if (!inside) emu::die("cp.async source %p is outside every input buffer (src-size %d)", gmem, src_bytes);
    emu::cp_async(dst, src, src_bytes == 16);
}

__forceinline__ void cp_async_commit()
{
    emu::commit_group();
}

template <int PENDING>
__forceinline__ void cp_async_wait()
{
    emu::wait_group(PENDING);
}

__forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr)
{
    emu::ldmatrix_x4(r, emu::shared_at(smem_addr, 16, "ldmatrix"), emu::LDSM);
}

__forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr)
{
    emu::ldmatrix_x4(r, emu::shared_at(smem_addr, 16, "ldmatrix.trans"), emu::LDSM_T);
}

__forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    emu::mma_16816(d, a, b0, b1, emu::MMA_F16);
}

// Device math the kernels call that host C++ lacks, as CUDA defines it (rsqrtf to within its 2 ulp).
inline int min(int a, int b) { return a < b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

#include KERNEL_SOURCE

// ---- the driver ---------------------------------------------------------------------------------------
namespace {

size_t float16_only(const std::string& name, const std::string& dtype)
{
    if (dtype != "float16") emu::die("buffer %s is %s: the kernel takes float16", name.c_str(), dtype.c_str());
    return 2;
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 5 && argc != 6) emu::die("usage: %s <dir> <order> <seed> <eager|late> [window base]", argv[0]);
    emu::set_schedule(argv[2], argv[3], argv[4]);
    if (argc == 6) emu::window_base = uint32_t(std::atol(argv[5]));
    if (emu::window_base % 16) emu::die("window base %u is not 16-byte aligned", emu::window_base);
    emu::Plan plan(argv[1], float16_only);
    for (const emu::Launch& l : plan.launches) {
        if (l.entry != KERNEL_ENTRY_NAME) emu::die("unknown entry %s", l.entry.c_str());
        if (l.args.size() != 6) emu::die("%s takes 6 arguments, the plan passes %zu", l.entry.c_str(), l.args.size());
        void* p[4];
        for (int i = 0; i < 4; ++i) p[i] = plan.buffer(l, i, "float16");
        const int S = plan.i32(l, 4), causal = plan.i32(l, 5);
        emu::launch(l.grid, l.block, l.shared, [=] {
            KERNEL_ENTRY(static_cast<const __half*>(p[0]), static_cast<const __half*>(p[1]),
                         static_cast<const __half*>(p[2]), static_cast<__half*>(p[3]), S, causal);
        });
    }
    plan.finish();
    return 0;
}
