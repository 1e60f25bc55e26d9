"""unprivatize_histogram: a block's shared-memory copy of a histogram's bins, flushed once per block, becomes one
global atomic add per element; forward finds its sites by analysis (a static copy for a number of bins, a dynamic one
sized by the plan for a bin-count parameter), for an element kernel or a grid-stride loop over the elements (the
copy's barriers outside the loop). Goldens, their nvcc builds, the histograms on the CPU emulator, and the kernels
it refuses, each with the attack that would make the copy wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Anchor, NotApplicable, get
from klineage.transforms.base import Placement
from tests.cuda_tools import feature_counts
from tests.sampled import sampled
from tests.transforms import emulate
from tests.transforms.golden import HERE, check_golden, compiles_without_spills, load, plan_of

CASES = ["bytes", "guarded", "clamped", "weights", "masked"]
STRIDE_CASES = ["stride_bytes", "stride_local"]  # the grid-stride form: a static copy, a dynamic one (stride a local)
SITE = Anchor("kernel", "function", "s_hist")
LOOP_SITE = Anchor("kernel", "loop", "s_hist")  # the grid-stride form's anchor


@pytest.fixture(scope="module")
def transform():
    return get("unprivatize_histogram")


def golden(case: str, which: str) -> KernelState:
    return load(HERE / "unprivatize_histogram" / case, which, "kernel")


def test_it_is_an_analysis_forward():
    assert get("unprivatize_histogram").placement is Placement.ANALYSIS


@pytest.mark.parametrize("case", CASES + STRIDE_CASES)
def test_golden(case):
    """backward(before) == after and forward(after) == before, plans included: forward then backward gives the
    naive kernel back byte for byte."""
    check_golden("unprivatize_histogram", case)


@pytest.mark.parametrize("case", CASES)
def test_forward_finds_the_naive_kernel_by_analysis(transform, case):
    naive, privatized = golden(case, "after"), golden(case, "before")
    assert transform.forward_sites(naive) == [SITE]
    assert transform.forward_sites(privatized) == []
    assert transform.find(naive) == [] and transform.find(privatized) == [SITE]
    assert transform.backward(transform.forward(naive, SITE).state, SITE).state == naive


def test_the_forms_it_writes(transform):
    """A number of bins: a static copy and no plan change; a parameter: a dynamic copy the plan sizes, used only
    where the bins fit (the naive work after `else` otherwise)."""
    static, dynamic = golden("bytes", "before"), golden("guarded", "before")
    assert "__shared__ int s_hist[256];" in static.source and static.plan == golden("bytes", "after").plan
    assert "extern __shared__ int s_hist[];" in dynamic.source
    assert "if (nbins > 0 && nbins <= 4096) {" in dynamic.source and "} else if (i < n) {" in dynamic.source
    assert dynamic.plan.launches[0].shared == "4 * (nbins if 0 < nbins <= 4096 else 0)"
    assert "__shared__ float s_hist[CLASSES];" in golden("weights", "before").source  # the float bins keep their type
    assert "__shared__ unsigned int s_hist[1024];" in golden("masked", "before").source
    forward = transform.forward(golden("bytes", "after"), SITE)
    assert forward.adds == ("shared_array",) and forward.removes == ()
    assert transform.backward(dynamic, SITE).removes == ("dynamic_shared",)


@pytest.mark.parametrize("case", sampled(CASES + STRIDE_CASES, keep=["bytes", "guarded", "stride_local"]))
def test_the_privatized_kernels_compile_with_shared_atomics(case, cache):
    """nvcc builds the forward's kernel without spills (the static and the dynamic copy, and the dynamic copy around
    a grid-stride `while` loop); its adds to the bins are shared-memory atomics (SASS ATOMS) behind one barrier, where
    the naive kernel has none (its builds run under -m slow)."""
    built = compiles_without_spills(golden(case, "before"), cache)
    assert built.resources_for("kernel").barriers == 1
    assert feature_counts(built).get("atoms", 0) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES + STRIDE_CASES)
def test_the_naive_kernels_compile_without_shared_atomics(case, cache):
    assert feature_counts(compiles_without_spills(golden(case, "after"), cache)).get("atoms", 0) == 0


def test_the_return_form_and_another_index_spelling_give_the_same_kernel(transform):
    naive = golden("guarded", "after")
    spelled = KernelState(source=naive.source.replace("blockIdx.x * blockDim.x + threadIdx.x",
                                                      "threadIdx.x + blockDim.x * blockIdx.x").replace(
        "    if (i < n) {\n        int b = x[i];\n        if (b >= 0 && b < nbins) atomicAdd(&hist[b], 1);\n    }",
        "    if (i >= n) return;\n    int b = x[i];\n    if (nbins > b && 0 <= b) atomicAdd(&hist[b], 1);"),
        plan=naive.plan)
    assert "return;" in spelled.source
    written = transform.forward(spelled, SITE).state
    # the `if` the return became holds the work; the compare is read either way round
    assert written.source == golden("guarded", "before").source.replace(
        "if (b >= 0 && b < nbins)", "if (nbins > b && 0 <= b)")
    assert written.plan == golden("guarded", "before").plan


# ---- the grid-stride form ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", STRIDE_CASES)
def test_forward_finds_the_grid_stride_kernel_by_analysis(transform, case):
    """The grid-stride form's anchor is the loop's: an element-form anchor on it is refused, and the element form's
    kernels have no loop anchor, both ways."""
    naive, privatized = golden(case, "after"), golden(case, "before")
    assert transform.forward_sites(naive) == [LOOP_SITE] and transform.forward_sites(privatized) == []
    assert transform.find(naive) == [] and transform.find(privatized) == [LOOP_SITE]
    assert transform.backward(transform.forward(naive, LOOP_SITE).state, LOOP_SITE).state == naive
    with pytest.raises(NotApplicable, match="its work the loop's"):
        transform.forward(naive, SITE)
    with pytest.raises(NotApplicable, match="its work the loop's"):
        transform.backward(privatized, SITE)
    element = golden("bytes", "after")
    with pytest.raises(NotApplicable, match="its work the function's"):
        transform.forward(element, LOOP_SITE)
    with pytest.raises(NotApplicable, match="its work the function's"):
        transform.backward(golden("bytes", "before"), LOOP_SITE)


def test_the_copy_and_its_barriers_sit_outside_the_loop(transform):
    """The zeroing loop and first barrier before the grid-stride loop, only its atomics changed, the second barrier
    and the flush after it; the plan keeps its grid (each block still counts many elements into one copy)."""
    written = golden("stride_bytes", "before").source
    loop = written.index("for (int i = ")
    assert written.index("__syncthreads();") < loop < written.rindex("__syncthreads();")
    body = written[loop:written.index("    }\n", loop)]
    assert "__syncthreads" not in body and "atomicAdd(&s_hist[v], 1);" in body
    assert golden("stride_bytes", "before").plan == golden("stride_bytes", "after").plan
    dynamic = golden("stride_while", "before").source  # the loop under the copy's branch, and as it was after `else`
    assert dynamic.count("while (i < n) {") == 2 and "} else while (i < n) {" in dynamic


@pytest.mark.parametrize("case", ["bytes", "guarded"])
def test_it_composes_with_uncoarsen_grid_stride(transform, case):
    """uncoarsen_grid_stride's forward writes a grid-stride loop that this forward reads (a static and a dynamic
    copy); backward then uncoarsen's backward give the element kernel back byte for byte."""
    uncoarsen, naive = get("uncoarsen_grid_stride"), golden(case, "after")
    [coarse] = uncoarsen.forward_sites(naive)
    strided = uncoarsen.forward(naive, coarse).state
    assert transform.forward_sites(strided) == [LOOP_SITE]
    privatized = transform.forward(strided, LOOP_SITE).state
    assert "i += gridDim.x * blockDim.x) " in privatized.source
    assert privatized.plan.launches[0].grid == strided.plan.launches[0].grid
    assert transform.find(privatized) == [LOOP_SITE]
    back = transform.backward(privatized, LOOP_SITE).state
    assert back == strided
    assert uncoarsen.backward(back, coarse).state == naive


# ---- the histograms on the CPU (tests/transforms/elementwise_emulator.cpp) -----------------------------------

def _emulated(state: KernelState) -> KernelState:
    """The kernel as the emulator builds it: its `extern __shared__` copy a pointer into the emulator's dynamic
    shared memory (`smem`, 0xFF at every block's start, a write past the bytes the launch asks for an error); the
    emulator reads `__shared__` as a function-static array, which an `extern` declaration cannot be."""
    declaration = "extern __shared__ int s_hist[];"
    if declaration not in state.source:
        return state
    assert state.source.count(declaration) == 1
    return KernelState(source=state.source.replace(declaration, "int* s_hist = reinterpret_cast<int*>(smem);"),
                       plan=state.plan)


def _histograms(tmp_path, case: str, state: KernelState, runs) -> list[torch.Tensor]:
    """The bins `state` leaves for each (n, bins) of `runs`, starting from nonzero bins (the flush adds to them)."""
    binary = emulate.build(tmp_path / "bin", _emulated(state))
    found = []
    for n, bins in runs:
        generator = torch.Generator().manual_seed(n * 7 + bins)
        params = {"n": n, "nbins": bins, "bins": bins}
        if case == "bytes":
            inputs = {"x": torch.randint(0, 256, (n,), generator=generator, dtype=torch.uint8)}
        elif case == "clamped":  # a fifth of the values below lo or above hi: the first and last bins
            inputs = {"x": torch.rand(n, generator=generator) * 1.4 - 0.2,
                      "w": torch.randint(-3, 9, (n,), generator=generator, dtype=torch.int32)}
            params |= {"lo": 0.0, "hi": 1.0}
        else:  # values a little outside the bins on either side, which the guard leaves out
            inputs = {"x": torch.randint(-5, bins + 5, (n,), generator=generator, dtype=torch.int32)}
        start = torch.randint(-1000, 1000, (bins,), generator=generator, dtype=torch.int32)
        [result] = emulate.run(binary, tmp_path / f"{n}-{bins}", state, params, inputs,
                               {"hist": (torch.int32, bins)}, starting={"hist": start}).values()
        found.append(result - start)
    return found


# blocks of 128 threads: n = 1000 ends in a partial block; 256 bins a multiple of the block, 100 fewer than a
# block and 300 more but no multiple; 5000 more than the dynamic copy holds (the naive branch)
DYNAMIC_RUNS = ((1000, 256), (1000, 100), (1000, 300), (700, 5000))


def test_the_dynamic_copy_counts_the_naive_bins_on_the_cpu(tmp_path):
    """The integer bins to the bit, for bin counts the block does and does not divide and one the copy cannot hold;
    each block's threads meet at both barriers (the emulator fails a barrier some thread skips), and no thread writes
    shared memory past the bytes the plan gives the launch."""
    naive, privatized = (_histograms(tmp_path / which, "guarded", golden("guarded", which), DYNAMIC_RUNS)
                         for which in ("after", "before"))
    for want, got in zip(naive, privatized, strict=True):
        assert want.sum() > 0 and torch.equal(got, want)
    # the bound check can fail: a plan giving the copy half its bytes has the threads write past them
    copy = golden("guarded", "before")
    halved = replace(copy.plan.launches[0], shared=copy.plan.launches[0].shared.replace("4 *", "2 *", 1))
    with pytest.raises(AssertionError, match="past the 512 the launch has"):
        _histograms(tmp_path / "halved", "guarded", replace(copy, plan=replace(copy.plan, launches=(halved,))),
                    DYNAMIC_RUNS[:1])


# blocks of 128 on cdiv(n, 1024) blocks: each thread loops about 8 times (n = 5000: 5 blocks, 640 threads, so its
# last steps are partial); 100 and 300 bins no multiple of the block, 5000 more than the copy holds
STRIDE_RUNS = ((5000, 100), (5000, 300), (3000, 5000))


def test_the_while_spelling_reads_as_the_for_loop_and_its_expert_form_walks_back(transform):
    """The `while` spelling of the dynamic copy's naive kernel (stride_while) is forwarded as its `for` loop
    (stride_local, `_c_style`), the same kernel but for the header comment; an expert written with `while` loops
    walks back to the `while` naive kernel."""
    naive, expert = golden("stride_while", "after"), golden("stride_while", "before")
    (site,) = transform.forward_sites(naive)
    forwarded = transform.forward(naive, site).state.source
    assert forwarded.split("\n")[2:] == golden("stride_local", "before").source.split("\n")[2:]
    assert transform.backward(expert, transform.find(expert)[0]).state.source == naive.source


def test_the_grid_stride_copy_counts_the_naive_bins_on_the_cpu(tmp_path):
    """The dynamic copy around a grid-stride `while` loop: each thread counts several elements into the block's copy,
    the integer bins are the naive kernel's to the bit, and every thread meets the block at both barriers (the
    emulator fails a barrier some thread skips) and stays inside the shared memory the plan gives the launch."""
    naive, privatized = (_histograms(tmp_path / which, "guarded", golden("stride_while", which), STRIDE_RUNS)
                         for which in ("after", "before"))
    for want, got in zip(naive, privatized, strict=True):
        assert want.sum() > 0 and torch.equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("case, runs", [("bytes", ((1000, 256), (77, 256))), ("clamped", ((1000, 300), (1000, 256)))])
def test_the_static_copy_and_the_clamp_count_the_naive_bins_on_the_cpu(tmp_path, case, runs):
    """256 bins of bytes (a multiple of the block of 128, for n that is not) and the clamped float bins with integer
    weights (blocks of 256, 300 bins and 256), to the bit."""
    naive, privatized = (_histograms(tmp_path / which, case, golden(case, which), runs)
                         for which in ("after", "before"))
    for want, got in zip(naive, privatized, strict=True):
        assert want.abs().sum() > 0 and torch.equal(got, want)


@pytest.mark.slow
def test_the_bins_see_a_flush_that_does_not_wait_for_the_block(tmp_path):
    """The check can fail: without the barrier before the flush, a thread adds its bins of the copy to the global
    histogram before the block's later threads have counted into them, and their counts never arrive."""
    privatized = golden("guarded", "before")
    early = KernelState(source=privatized.source.replace("        }\n        __syncthreads();\n", "        }\n", 1),
                        plan=privatized.plan)
    assert early.source.count("__syncthreads();") == 1
    naive, wrong = (_histograms(tmp_path / name, "guarded", state, DYNAMIC_RUNS[:1])
                    for name, state in (("naive", golden("guarded", "after")), ("early", early)))
    assert not torch.equal(naive[0], wrong[0])


# ---- what it refuses ------------------------------------------------------------------------------------------

ARGS = '"x", "y", "hist", { scalar = "n", type = "i32" }, { scalar = "nbins", type = "i32" }'
PLAN = plan_of(ARGS, grid="cdiv(n, 128)", block=128)
HEAD = ("__global__ void kernel(const int* x, int* y, int* hist, int n, int nbins) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n")
GUARDED = "if (b >= 0 && b < nbins) atomicAdd(&hist[b], 1);"


def _work(*lines: str) -> str:
    return "    if (i < n) {\n" + "".join(f"        {line}\n" for line in lines) + "    }\n"


@pytest.mark.parametrize("body, plan, why", [
    # the copy would hide a read of the global bins the flush has not reached yet
    (_work("int b = x[i];", GUARDED, "y[i] = hist[0];"), PLAN, "touches 'hist' beyond its atomic adds"),
    (_work("int b = x[i];", GUARDED, "hist[1] = 0;"), PLAN, "touches 'hist' beyond its atomic adds"),
    # an index nothing bounds: any bin count the copy took could be too few
    (_work("atomicAdd(&hist[x[i]], 1);"), PLAN, "`x\\[i\\]` is not bounded"),
    (_work("int b = x[i];", "if (b < nbins) atomicAdd(&hist[b], 1);"), PLAN, "`b` may be negative"),
    (_work("atomicAdd(&hist[x[i] % 256], 1);"), PLAN, "may be negative"),  # a negative x leaves a negative remainder
    # the bound no longer holds where the atomic reads the index
    (_work("int b = x[i];", "if (b >= 0 && b < nbins) { b = b + 1; atomicAdd(&hist[b], 1); }"), PLAN, "not bounded"),
    (_work("int b = min(max(x[i], 0), nbins - 1);", "if (x[i] > 100) b = x[i];", "atomicAdd(&hist[b], 1);"), PLAN,
     "not bounded"),
    (_work("int b = x[i];", "nbins = nbins / 2;", GUARDED), PLAN, "not bounded"),
    (_work("int b = x[i];", "int nbins = 1 << 20;", GUARDED), PLAN, "not bounded"),  # a local hides the parameter
    # a thread that leaves early would miss the block's barriers
    ("    if (i >= n) return;\n    int b = x[i];\n    if (b < 0 || b >= nbins) return;\n    atomicAdd(&hist[b], 1);\n",
     PLAN, "returns.*`return`"),
    # a loop in the work (one with a barrier no thread may skip, or any)
    (_work("for (int j = 0; j < 4; ++j) atomicAdd(&hist[(x[i] + j) & 63], 1);"), PLAN, "loops.*`for`"),
    (_work("int b = x[i];", "if (b >= 0 && b < nbins) { atomicAdd(&hist[b], 1); __syncthreads(); }"), PLAN,
     "synchronizes.*`__syncthreads`"),
    # the old value read: each thread would see a block's partial count, not the global one
    (_work("int b = x[i];", "if (b >= 0 && b < nbins) y[i] = atomicAdd(&hist[b], 1);"), PLAN, "old value"),
    # other atomics, other arrays
    (_work("int b = x[i];", "if (b >= 0 && b < nbins) atomicMax(&hist[b], 1);"), PLAN, "other atomics"),
    (_work("int b = x[i];", GUARDED, "atomicAdd(&y[0], 1);"), PLAN, "2 arrays"),
    (_work("atomicAdd(&hist[0], x[i]);"), PLAN, "only at fixed places"),  # a sum: unaggregate_atomics' site
    (_work("int b = x[i];", GUARDED, "if ((b & 7) == 0) atomicAdd(&hist[b & 7], 1);"), PLAN, "different counts"),
    # a 2-D launch, and a 2-D index
    (_work("int b = x[i];", GUARDED), plan_of(ARGS, grid='cdiv(n, 128)", "2', block=128), "more than 1 dimension"),
    # too many bins for the copy: 8192 ints are 32 KiB
    (_work("atomicAdd(&hist[x[i] & 8191], 1);"), PLAN, "8192 bins of int take more than the 16 KiB"),
    # a bin count the plan does not pass as an integer, and a launch that asks for shared memory already
    (_work("int b = x[i];", GUARDED), plan_of('"x", "y", "hist", { scalar = "n", type = "i32" }, '
                                              '{ scalar = "nbins", type = "f32" }', grid="cdiv(n, 128)", block=128),
     "no integer for its bin count"),
    (_work("int b = x[i];", GUARDED), LaunchPlan.from_toml(
        'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["cdiv(n, 128)"]\nblock = [128]\n'
        f"shared = 64\nargs = [{ARGS}]\n"), "dynamic shared memory already"),
    # a call that may have an effect
    (_work("int b = x[i];", "if (b >= 0 && b < nbins) { printf(\"%d\", b); atomicAdd(&hist[b], 1); }"), PLAN,
     "may have effects"),
])
def test_no_site_where_it_would_not_be_legal(transform, body, plan, why):
    state = KernelState(source=HEAD + body + "}\n", plan=plan)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, SITE)


def test_a_2d_index_and_a_bin_count_of_another_type_are_no_site(transform):
    row = ("__global__ void kernel(const int* x, int* hist, int n) {\n    int i = blockIdx.x * blockDim.x + "
           "threadIdx.x;\n    if (i < n) atomicAdd(&hist[(x[i] + blockIdx.y) & 255], 1);\n}\n")
    with pytest.raises(NotApplicable, match="thread coordinate"):
        transform.forward(KernelState(source=row, plan=plan_of('"x", "hist", { scalar = "n", type = "i32" }')), SITE)
    wide = HEAD.replace("int nbins", "long long nbins") + _work("int b = x[i];", GUARDED) + "}\n"
    with pytest.raises(NotApplicable, match="not bounded"):
        transform.forward(KernelState(source=wide, plan=PLAN), SITE)


def test_a_clamp_through_the_sources_own_min_is_no_bound(transform):
    """`min` and `max` are CUDA's only where the source defines neither: its own could return anything."""
    own = "#define min(a, b) (a)\n" + HEAD + _work("atomicAdd(&hist[min(max(x[i], 0), nbins - 1)], 1);") + "}\n"
    with pytest.raises(NotApplicable, match="not bounded"):
        transform.forward(KernelState(source=own, plan=PLAN), SITE)
    constant = HEAD.replace("int nbins", "const int nbins") + _work("int b = x[i];", GUARDED) + "}\n"
    assert transform.forward_sites(KernelState(source=constant, plan=PLAN)) == [SITE]


def test_the_bounds_it_reads(transform):
    """Each spelling of a bounded index it reads, and the count the copy takes from it."""
    for line, count in [("atomicAdd(&hist[min(max(x[i], 0), nbins - 1)], 1);", "nbins"),
                        ("atomicAdd(&hist[max(min(x[i], nbins - 1), 0)], 1);", "nbins"),
                        ("atomicAdd(&hist[x[i] & 63], 1);", "64"),
                        ("atomicAdd(&hist[(unsigned)x[i] % 100u], 1);", "100u"),
                        ("unsigned b = x[i] - 3; if (b < nbins) atomicAdd(hist + b, 2);", "nbins"),
                        ("int b = x[i]; if (b >= 0) { if (b <= 99) atomicAdd(&hist[b], 1); }", "100"),
                        ("atomicAdd(&hist[(unsigned char)x[i]], 1);", "256")]:
        state = KernelState(source=HEAD + _work(line) + "}\n", plan=PLAN)
        written = transform.forward(state, SITE).state.source
        assert f"k < {count};" in written, (line, written)
        assert transform.backward(transform.forward(state, SITE).state, SITE).state == state


# the grid-stride form: one launch of blocks of 128 on a grid an eighth the elements' blocks
STRIDE_PLAN = plan_of(ARGS, grid="cdiv(n, 1024)", block=128)
STRIDE_HEAD = "__global__ void kernel(const int* x, int* y, int* hist, int n, int nbins) {\n"
LOOP = "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {\n"


def _strided(*lines: str, loop: str = LOOP, after: str = "") -> str:
    """A grid-stride histogram kernel: `lines` the loop's body, `after` the statements after the loop."""
    return STRIDE_HEAD + "    " + loop + "".join(f"        {line}\n" for line in lines) + "    }\n" + after + "}\n"


@pytest.mark.parametrize("source, why", [
    # a thread that leaves the loop early skips the barrier after it while its block waits there; the early exits
    # themselves (a `continue` too, which a `while` loop's step would be skipped by) are read as jumps
    (_strided("int b = x[i];", "if (b < 0) return;", GUARDED), "jumps.*`return`"),
    (_strided("int b = x[i];", "if (b < 0) break;", GUARDED), "jumps.*`break`"),
    (_strided("int b = x[i];", "if (b < 0) continue;", GUARDED), "jumps.*`continue`"),
    # a barrier inside the loop: threads with fewer elements leave the loop and never reach it again
    (_strided("int b = x[i];", GUARDED, "__syncthreads();"), "synchronizes.*`__syncthreads`"),
    # an inner loop (which could hold any of those)
    (_strided("int b = x[i];", GUARDED, "for (int j = 0; j < 2; ++j) y[i] = j;"), "loops.*`for`"),
    # a stride that is not the grid's: with the block's width every block visits the same elements (a kernel that
    # names no grid, read as the element form, which has no loop); with twice the grid's, the loop skips elements
    (_strided("int b = x[i];", GUARDED, loop=LOOP.replace("i += blockDim.x * gridDim.x", "i += blockDim.x")),
     "no `int i = "),
    (_strided("int b = x[i];", GUARDED, loop=LOOP.replace("i += ", "i += 2 * ")), "loop is not `i < n"),
    # a loop that starts at the thread's index within its block: every block visits the same elements
    (_strided("int b = x[i];", GUARDED, loop=LOOP.replace("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x")),
     "not start at the global thread index"),
    # code after the loop: a read of the global bins there would see them before this block's flush
    (_strided("int b = x[i];", GUARDED, after="    if (threadIdx.x == 0) y[blockIdx.x] = hist[0];\n"),
     "not one grid-stride loop"),
    (_strided("int b = x[i];", GUARDED, after="    y[0] = 1;\n"), "not one grid-stride loop"),
    # the loop reads the bins it counts into: the copy would hide the other blocks' counts
    (_strided("int b = x[i];", GUARDED, "y[i] = hist[b & 7];"), "touches 'hist' beyond its atomic adds"),
    # the loop changes its index: it would visit other elements than the naive kernel's
    (_strided("int b = x[i];", GUARDED, "i += 1;"), "changes its element index"),
    # the same bounded-index rules as the element form's work
    (_strided("atomicAdd(&hist[x[i]], 1);"), "`x\\[i\\]` is not bounded"),
    (_strided("atomicAdd(&hist[i % 256], 1);"), "may be negative"),
    (_strided("int b = x[i];", "if (b < nbins) atomicAdd(&hist[b], 1);"), "`b` may be negative"),
    (_strided("atomicAdd(&hist[x[i] & 8191], 1);"), "8192 bins of int take more than the 16 KiB"),
    (_strided("int b = x[i];", "if (b >= 0 && b < nbins) y[i] = atomicAdd(&hist[b], 1);"), "old value"),
])
def test_no_grid_stride_site_where_it_would_not_be_legal(transform, source, why):
    state = KernelState(source=source, plan=STRIDE_PLAN)
    assert transform.forward_sites(state) == []
    with pytest.raises(NotApplicable, match=why):
        transform.forward(state, LOOP_SITE)


def test_the_grid_stride_kernels_it_reads(transform):
    """The loop as `_flatten` reads it, and the bounds as the element form reads them: each a site, forward then
    backward the kernel again."""
    for source in [_strided("int b = x[i];", GUARDED),
                   _strided("atomicAdd(&hist[i & 255], 1);"),  # the index itself, masked: a bin whatever i is
                   STRIDE_HEAD + "    int stride = gridDim.x * blockDim.x;\n    " +
                   LOOP.replace("blockDim.x * gridDim.x", "stride") + "        atomicAdd(&hist[x[i] & 63], 1);\n"
                   "    }\n}\n"]:
        state = KernelState(source=source, plan=STRIDE_PLAN)
        assert transform.forward_sites(state) == [LOOP_SITE], source
        written = transform.forward(state, LOOP_SITE).state
        assert transform.backward(written, LOOP_SITE).state == state
