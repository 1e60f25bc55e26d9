// Runs gdn/chunked_mma's kernel source on the CPU: every CUDA thread of a CTA is a fiber (ucontext),
// CTAs run one after another, and the PTX the kernel wraps (ldmatrix, mma.sync, cp.async) is emulated as
// the PTX ISA defines it (tests/mma_emulator.h). tests/test_corpus_gdn_mma.py builds it with the kernel's
// source, minus its PTX wrappers, spliced in at KERNEL_SOURCE.
//
// What it checks besides the numbers: warp-collective operations reached by all 32 lanes together and
// the same one; __syncthreads reached by every thread (a deadlock is an error); ldmatrix and cp.async
// addresses (generic pointers) 16-byte aligned and inside the launch's dynamic shared memory; every
// cp.async committed and waited for; nothing written past the shared memory the plan asks for or outside
// any global buffer (guards); shared memory starts as NaN in every CTA. Races show up as results that
// change with the schedule: threads run in forward, reverse or seeded random order between blocking
// points, or one warp at a time, and cp.async copies land either when issued (eager) or only when their
// thread waits (late).
//
//   gdn_mma_emulator <dir> <order: forward|reverse|random|warps|warps_reverse> <seed> <copies: eager|late>
// reads <dir>/plan.txt and the inputs <dir>/<name>.bin, writes the outputs and scratch buffers as
// <dir>/<name>.bin; exits 1 with a message on stderr when a check fails.
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#define EMU_SMEM_ALIGN 128
#include "mma_emulator.h"

// ---- the kernel's PTX wrappers, emulated ------------------------------------------------------------
__forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row)
{
    emu::check_shared(row, 16, "ldmatrix");
    emu::ldmatrix_x4(r, static_cast<const unsigned char*>(row), emu::LDSM);
}

__forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* row)
{
    emu::check_shared(row, 16, "ldmatrix.trans");
    emu::ldmatrix_x4(r, static_cast<const unsigned char*>(row), emu::LDSM_T);
}

__forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    emu::mma_16816(d, a, b0, b1, emu::MMA_BF16);
}

__forceinline__ void cp_async16(void* dst, const void* src, bool valid)
{
    emu::check_shared(dst, 16, "cp.async destination");
    if (valid && reinterpret_cast<uintptr_t>(src) % 16) emu::die("cp.async source %p is not 16-byte aligned", src);
    emu::cp_async(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), valid);
}

__forceinline__ void cp_async_commit()
{
    emu::commit_group();
}

__forceinline__ void cp_async_wait_all()
{
    emu::wait_group(0);
}

#include KERNEL_SOURCE

// ---- the driver ---------------------------------------------------------------------------------------
namespace {

size_t dtype_size(const std::string& name, const std::string& dtype)
{
    if (dtype == "bfloat16") return 2;
    if (dtype == "float32") return 4;
    emu::die("unknown dtype %s for buffer %s", dtype.c_str(), name.c_str());
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 5) emu::die("usage: %s <dir> <order> <seed> <eager|late>", argv[0]);
    emu::set_schedule(argv[2], argv[3], argv[4]);
    emu::Plan plan(argv[1], dtype_size);
    for (const emu::Launch& l : plan.launches) {
        if (l.entry == "gdn_chunk_prep") {
            if (l.args.size() != 12) emu::die("gdn_chunk_prep takes 12 arguments, the plan passes %zu", l.args.size());
            auto q = (const bf16*)plan.buffer(l, 0, "bfloat16");
            auto k = (const bf16*)plan.buffer(l, 1, "bfloat16");
            auto g = (const float*)plan.buffer(l, 2, "float32");
            auto beta = (const bf16*)plan.buffer(l, 3, "bfloat16");
            auto x = (bf16*)plan.buffer(l, 4, "bfloat16");
            auto p = (bf16*)plan.buffer(l, 5, "bfloat16");
            auto gc = (float*)plan.buffer(l, 6, "float32");
            const int B = plan.i32(l, 7), T = plan.i32(l, 8), H = plan.i32(l, 9), HV = plan.i32(l, 10),
                      DK = plan.i32(l, 11);
            emu::launch(l.grid, l.block, l.shared, [=] { gdn_chunk_prep(q, k, g, beta, x, p, gc, B, T, H, HV, DK); });
        } else if (l.entry == "gdn_chunk_state") {
            if (l.args.size() != 13) emu::die("gdn_chunk_state takes 13 arguments, the plan passes %zu", l.args.size());
            auto q = (const bf16*)plan.buffer(l, 0, "bfloat16");
            auto k = (const bf16*)plan.buffer(l, 1, "bfloat16");
            auto v = (const bf16*)plan.buffer(l, 2, "bfloat16");
            auto x = (const bf16*)plan.buffer(l, 3, "bfloat16");
            auto p = (const bf16*)plan.buffer(l, 4, "bfloat16");
            auto gc = (const float*)plan.buffer(l, 5, "float32");
            auto o = (bf16*)plan.buffer(l, 6, "bfloat16");
            const int B = plan.i32(l, 7), T = plan.i32(l, 8), H = plan.i32(l, 9), HV = plan.i32(l, 10),
                      DK = plan.i32(l, 11), DV = plan.i32(l, 12);
            emu::launch(l.grid, l.block, l.shared, [=] { gdn_chunk_state(q, k, v, x, p, gc, o, B, T, H, HV, DK, DV); });
        } else {
            emu::die("unknown entry %s", l.entry.c_str());
        }
    }
    plan.finish();
    return 0;
}
