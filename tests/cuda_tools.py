"""Host-side CUDA helpers the kernel tests share: build and run a host harness that prints integer
tables; build and run the CPU emulators of mma.sync kernels (tests/*_mma_emulator.cpp); count the SASS
mnemonics and opcodes of a cubin; the build checks and the compile-only gate
of the sm_90a (wgmma) experts; and the PTX ISA as models (the 128B swizzle and where TMA puts a
box's elements with it, the wgmma accumulator and register-A layouts, the wgmma descriptor and the
K-major / MN-major B it reads through it, the mma.m16n8k16 and ldmatrix fragment layouts, an
mbarrier for the pipeline protocol simulations)."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from klineage.features.sass import sass_features
from klineage.toolchain import find_toolchain, run_tool
from shared_cache import BUILDS_ENV


def run_host_harness(work: Path, arch: str = "sm_90") -> dict[str, list[list[int]]]:
    """Build `work/harness.cu` for `arch` (the device code of the kernel it includes must compile
    for it: sm_90a for wgmma) and run it on the host; each printed line `KEY v1 v2 ...` becomes a
    row of table KEY."""
    toolchain = find_toolchain()
    # -arch=sm_90a would also build compute_90 PTX, where wgmma does not exist: name the one target.
    target = "-arch=sm_90" if arch == "sm_90" else f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"
    build = subprocess.run([toolchain.nvcc, "-std=c++17", target, "-o", "harness", "harness.cu"], cwd=work,
                           capture_output=True, text=True, env=toolchain.environment(work), timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(work / "harness")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    tables: dict[str, list[list[int]]] = {}
    for line in run.stdout.splitlines():
        key, *values = line.split()
        tables.setdefault(key, []).append([int(v) for v in values])
    return tables


# ---- the CPU emulators of mma.sync kernels: tests/<kernel>_mma_emulator.cpp on tests/mma_emulator.h ----


def ptx_helper_bodies(source: str, names) -> dict[str, str]:
    """name -> the whole definition (a template line included) of each of the kernel's PTX wrappers `names`,
    each defined exactly once as `__device__ __forceinline__ ... name(...) {...}` ending at a `}` line."""
    bodies = {}
    for name in names:
        found = re.findall(rf"^(?:template <[^\n]*>\n)?__device__ __forceinline__ [^\n]*?\b{name}\(.*?^\}}\n",
                           source, re.M | re.S)
        assert len(found) == 1, (name, len(found))
        bodies[name] = found[0]
    return bodies


def emulator_source(source: str, names) -> str:
    """The kernel source without its PTX wrappers `names` (the emulator defines them)."""
    for body in ptx_helper_bodies(source, names).values():
        source = source.replace(body, "")
    return source


def build_mma_emulator(work: Path, emulator: Path, source: str, names, *defines: str) -> Path:
    """Build `emulator` in `work` with the kernel `source`, minus its PTX wrappers `names`, spliced in at
    KERNEL_SOURCE and the macros `defines` (NAME=VALUE); the emulator's folder holds mma_emulator.h.
    A build of the same bytes earlier in the run (the naive kernel of every parametrized case, a golden
    state several tests emulate) is that build's binary: see `_built`."""
    toolchain = find_toolchain()
    included = emulator_source(source, names)
    command = emulator_command(emulator.parent, "kernel_emu.inc", *defines)
    key = _build_key(command, emulator, included)
    built = _built(key)
    if built is not None:
        return built
    (work / "kernel_emu.inc").write_text(included)
    shutil.copy(emulator, work / "emulator.cpp")
    build = subprocess.run(command, cwd=work, capture_output=True, text=True, env=toolchain.environment(work),
                           timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    return _keep_build(key, work / "emulator")


def emulator_command(headers: Path, kernel_source: str, *defines: str) -> list[str]:
    """The build of `emulator.cpp` into `emulator` in the current folder, the kernel file `kernel_source` spliced in
    at KERNEL_SOURCE, `headers` the folder of mma_emulator.h, the macros `defines` (NAME=VALUE)."""
    # -O1: a build (about 2.2 s against 3.1 s at -O2) costs more than the small runs a test makes of it
    return [*_host_compiler(), "-std=c++17", "-O1", "-w", *_prelude(), f"-I{headers}",
            f'-DKERNEL_SOURCE="{kernel_source}"', *(f"-D{d}" for d in defines), "-o", "emulator", "emulator.cpp"]


# The emulators are host C++. nvcc would compile them with its host compiler and add a device link step, and
# it cannot use a precompiled header; so they are built by that compiler directly, with the defines and CUDA
# include folders nvcc gives it (read off nvcc's dry run), and with the system headers every emulator includes
# precompiled once a run: about a third of each build's 1.7 s was parsing them.
PRELUDE = ("cuda_runtime.h", "cuda_bf16.h", "cuda_fp16.h", "ucontext.h", "algorithm", "cmath", "cstdarg",
           "cstdint", "cstdio", "cstdlib", "cstring", "fstream", "functional", "map", "random", "sstream", "string",
           "tuple", "type_traits", "utility", "vector")


@functools.cache
def _host_compiler() -> tuple[str, ...]:
    """nvcc's host compiler (as the C++ driver, which links the C++ library) with the flags nvcc passes it."""
    toolchain = find_toolchain()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "probe.cpp").write_text("int main() { return 0; }\n")
        dry = subprocess.run([toolchain.nvcc, "--dryrun", "-c", "probe.cpp"], cwd=work, capture_output=True,
                             text=True, env=toolchain.environment(work), timeout=120)
    compiles = [shlex.split(line[3:]) for line in dry.stderr.splitlines()
                if line.startswith("#$ ") and " -x c++ " in line and "probe.cpp" in line]
    assert dry.returncode == 0 and len(compiles) == 1, f"nvcc's host compile step not found:\n{dry.stderr}"
    words, flags = compiles[0], []
    for at, word in enumerate(words[1:], 1):
        if word.startswith(("-D", "-I", "-m")) or word == "-isystem" or words[at - 1] == "-isystem":
            flags.append(word)
    return (re.sub(r"gcc(-[\d.]+)?$", r"g++\1", words[0]), *flags)


@functools.cache
def _prelude() -> tuple[str, ...]:
    """-include of the run's precompiled prelude (built once by content into the builds folder), or () where
    the run keeps no builds."""
    folder = os.environ.get(BUILDS_ENV)
    if not folder:
        return ()
    text = "".join(f"#include <{header}>\n" for header in PRELUDE)
    command = [*_host_compiler(), "-std=c++17", "-O1", "-w", "-x", "c++-header"]
    key = hashlib.sha256("\0".join([*command, text]).encode()).hexdigest()[:16]
    header = Path(folder) / f"prelude-{key}" / "prelude.h"
    if not header.with_suffix(".h.gch").is_file():
        header.parent.mkdir(parents=True, exist_ok=True)
        partial = header.with_name(f"prelude.{os.getpid()}.h")  # two workers may build it: the rename is whole
        partial.write_text(text)
        os.replace(partial, header)
        built = subprocess.run([*command, str(header), "-o", f"{header}.{os.getpid()}.gch"], capture_output=True,
                               text=True, env=find_toolchain().environment(header.parent), timeout=600)
        assert built.returncode == 0, built.stdout + built.stderr
        os.replace(f"{header}.{os.getpid()}.gch", header.with_suffix(".h.gch"))
    return ("-include", str(header))


# The key is every byte the build reads (the command, the emulator, every header of tests/, the spliced kernel),
# so a binary kept under it is the binary that building again would make.
def _build_key(command: list[str], emulator: Path, included: str) -> str:
    digest = hashlib.sha256("\0".join(command).encode())
    digest.update(_file_digest(emulator).encode() + _headers_digest().encode() + included.encode())
    return digest.hexdigest()


@functools.cache
def _file_digest(path: Path) -> str:  # the test sources do not change during a run: read once a process
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def _headers_digest() -> str:
    headers = sorted(Path(__file__).resolve().parent.rglob("*.h"))
    return hashlib.sha256("".join(f"{h.name}:{_file_digest(h)}" for h in headers).encode()).hexdigest()


def _built(key: str) -> Path | None:
    folder = os.environ.get(BUILDS_ENV)
    found = Path(folder) / key if folder else None
    return found if found is not None and found.is_file() else None


def _keep_build(key: str, binary: Path) -> Path:
    folder = os.environ.get(BUILDS_ENV)
    if not folder:
        return binary
    Path(folder).mkdir(parents=True, exist_ok=True)
    kept = Path(folder) / key
    partial = kept.with_name(f"{key}.{os.getpid()}.partial")  # two workers may build one key: the rename is whole
    shutil.copy2(binary, partial)
    os.replace(partial, kept)
    return kept


def run_mma_emulator(binary: Path, work: Path, inputs: dict, buffers: list[str], launches, *args) -> str:
    """Run a built emulator on a plan written to `work`: the `inputs` (name -> CPU tensor, as <name>.bin),
    the other `buffers` ("<name> <dtype> <count> <output|scratch>", written back as <name>.bin) and the
    resolved `launches`, in order; `args` follow the folder on the command line (order, seed, copies, ...).
    "" when it ran clean, else the emulator's complaint."""
    import torch

    lines = []
    for name, t in inputs.items():
        (work / f"{name}.bin").write_bytes(t.contiguous().view(torch.uint8).numpy().tobytes())
        lines.append(f"buffer {name} {str(t.dtype).removeprefix('torch.')} {t.numel()} input")
    lines += [f"buffer {b}" for b in buffers]
    for launch in launches:
        launch_args = [f"buf:{value}" if kind == "buffer" else f"i32:{value}" for kind, value, _ in launch.args]
        lines.append(" ".join(["launch", launch.entry, *map(str, launch.grid), *map(str, launch.block),
                               str(launch.shared), *launch_args]))
    (work / "plan.txt").write_text("\n".join(lines) + "\n")
    run = subprocess.run([str(binary), str(work), *map(str, args)], capture_output=True, text=True, timeout=600)
    return "" if run.returncode == 0 else run.stderr.strip() or f"exit {run.returncode}"


_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def sass_mnemonics(cubin: bytes) -> Counter:
    """Mnemonic counts (modifiers dropped) from cuobjdump -sass; @!PT dummies excluded."""
    toolchain = find_toolchain()
    toolchain.require_nvdisasm()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = run_tool([toolchain.cuobjdump, "-sass", str(path)], env=toolchain.environment(Path(tmp)), cwd=tmp)
    counts: Counter = Counter()
    for line in text.splitlines():
        match = _SASS_LINE.match(line)
        if match and (match.group(1) or "").strip() != "@!PT":
            counts[match.group(2)] += 1
    return counts


_SASS_OPCODE_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;?\s*/\*\s*0x[0-9a-f]+\s*\*/\s*$")


def sass_instructions(result, arch: str = "sm_90a") -> list[str]:
    """The opcodes (with modifiers) of a CompileResult's cubin for `arch`, in the order cuobjdump lists them;
    never-executed @!PT padding left out, a predicate guard dropped."""
    toolchain = find_toolchain()
    path = result.cubin_paths[arch]
    text = run_tool([toolchain.cuobjdump, "-sass", path], env=toolchain.environment(Path(path).parent))
    found = []
    for line in text.splitlines():
        match = _SASS_OPCODE_LINE.match(line)
        if not match or not match.group(1):
            continue
        words = match.group(1).split()
        if words[0].startswith("@"):
            if words[0] == "@!PT":
                continue
            words = words[1:]
        found.append(words[0])
    return found


def sass_opcodes(result, arch: str = "sm_90a") -> Counter:
    """Opcode (with modifiers) -> static count in the SASS of a CompileResult's cubin for `arch`."""
    return Counter(sass_instructions(result, arch))


def feature_counts(result) -> dict[str, int]:
    """SASS feature name -> count over every locus of a CompileResult's cubin."""
    counts: dict[str, int] = {}
    for feature, n in sass_features(result.cubin_bytes()).counts.items():
        counts[feature.name] = counts.get(feature.name, 0) + n
    return counts


def count(opcodes: Counter, pattern: str) -> int:
    """How many of the opcodes match `pattern` (re.search)."""
    regex = re.compile(pattern)
    return sum(n for op, n in opcodes.items() if regex.search(op))


def sm90a_resources(result, entry: str):
    """A wgmma expert's build: compiled for sm_90a alone (wgmma and setmaxnreg exist only on the
    arch-specific target), no "wgmma ... serialized" warning from ptxas, no spills, no stack, no
    static shared memory (all of it is dynamic, sized by the plan). Returns `entry`'s resources."""
    assert result.ok, result.log
    assert result.targets == ("sm_90a",)
    assert "serializ" not in result.log.lower()
    res = result.resources_for(entry, "sm_90a")
    assert not res.spills and res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_bytes == 0, res
    assert res.shared_bytes == 0
    return res


def assert_compiles_up_to_the_gpu(problem: Path, state, cache, cases: set[str], skipped: set[str]) -> None:
    """Compile-only gate of a wgmma expert: static check, sm_90a compile, SASS features and the plan
    resolved on an H200 for `cases` (tensor maps included); `skipped` are outside the domain and not run.
    Its SASS has warpgroup MMAs and TMA loads, and neither mma.sync nor cp.async."""
    from klineage.config import GateMode
    from klineage.gate.pipeline import run_gate
    from klineage.gate.verdict import Status

    verdict = run_gate(problem, state, mode=GateMode.COMPILE_ONLY, cache=cache)
    assert verdict.status is Status.COMPILED, verdict.findings
    assert set(verdict.cases) == cases
    assert set(verdict.domain["skipped"]) == skipped
    sass = {row["name"]: row["count"] for row in verdict.features["sass"]["counts"]}
    assert sass.get("hgmma") and sass.get("utmaldg") and not sass.get("hmma") and not sass.get("ldgsts")


# ---------------------------------------------------------------------------------------------
# The PTX ISA, as models
# ---------------------------------------------------------------------------------------------


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def swizzle_128b(address):
    """The 128-byte swizzle of TMA and wgmma alike, on shared addresses: 16-byte chunk bits 4-6 XOR
    row (line) bits 7-9 (works on ints, and elementwise on integer tensors and numpy arrays)."""
    return address ^ (((address >> 7) & 7) << 4)


def ptx_wgmma_d(t: int, i: int) -> tuple[int, int]:
    """(row, col) of accumulator d_i of warpgroup thread t in a wgmma .m64nNk16 fp32 D tile (PTX ISA)."""
    warp, lane = t // 32, t % 32
    return 16 * warp + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


def ptx_wgmma_a(t: int, i: int) -> tuple[int, int]:
    """(row, k) of element a_i of warpgroup thread t in wgmma .m64nNk16's register-A fragment with
    .f16/.bf16 (PTX ISA, "Matrix Fragments for wgmma.mma_async.m64nNk16", the register-A figure):
    warp w holds rows 16 w .. 16 w + 15; a0, a1 and a4, a5 are on row lane / 4, a2, a3 and a6, a7
    8 rows below; a0 .. a3 at k = 2 (lane % 4) + i % 2, a4 .. a7 8 further. Register i // 2."""
    warp, lane = t // 32, t % 32
    return 16 * warp + lane // 4 + 8 * ((i // 2) % 2), 2 * (lane % 4) + i % 2 + 8 * (i // 4)


# The shared-memory operands of wgmma (PTX ISA, "Matrix Descriptor Format" and "Shared Memory Matrix
# Layout" of the asynchronous warpgroup MMA), for 16-bit elements and the 128-byte swizzle.


def wgmma_descriptor(start: int, leading: int, stride: int, swizzle: int = 1, base_offset: int = 0) -> int:
    """The 64-bit matrix descriptor: start address, leading and stride byte offsets in 16-byte units
    (bits 0-13, 16-29, 32-45), base offset (bits 49-51), swizzle mode (bits 62-63, 1 = 128 bytes)."""
    return (((start & 0x3FFFF) >> 4) | (leading >> 4 & 0x3FFF) << 16 | (stride >> 4 & 0x3FFF) << 32
            | (base_offset & 7) << 49 | (swizzle & 3) << 62)


def wgmma_b_address(descriptor: int, trans_b: int, k: int, n: int) -> int:
    """The shared address wgmma reads element (k, n) of its k16 B operand from (128-byte swizzle, base
    offset 0). The canonical layouts of 16-bit elements, as byte offsets before the swizzle:
    K-major (imm-trans-b 0): row n of N, k contiguous; rows 128 bytes apart, 8-row groups SBO apart.
    MN-major (imm-trans-b 1): line k of 64 contiguous n; lines 128 bytes apart, 8-line groups of k
    SBO apart, the next 64 columns of n LBO further."""
    start, leading, stride = ((descriptor >> shift & 0x3FFF) << 4 for shift in (0, 16, 32))
    assert descriptor >> 62 == 1 and (descriptor >> 49) & 7 == 0, "only the 128-byte swizzle with base offset 0"
    if trans_b:
        offset = (k // 8) * stride + (k % 8) * 128 + (n // 64) * leading + 2 * (n % 64)
    else:
        offset = (n // 8) * stride + (n % 8) * 128 + 2 * k
    return swizzle_128b(start + offset)


def tma_box_128b(box: int, row: int, col: int) -> int:
    """Where a TMA load with the 128-byte swizzle puts 16-bit element (row, col) of a box whose rows
    are 128 bytes (64 elements), the box at a 1024-byte-aligned shared address."""
    assert box % 1024 == 0 and 0 <= col < 64
    return swizzle_128b(box + 128 * row + 2 * col)


# The PTX ISA's fragment layouts of mma.m16n8k16 with .f16/.bf16, and ldmatrix .m8n8 .x4 (plain and .trans).
# Element i of a fragment: register i // 2, low half-word for even i.


def ptx_a(lane: int, i: int) -> tuple[int, int]:
    """(row, k) of element a_i held by `lane` in the 16 x 16 A tile."""
    group, tig = lane >> 2, lane % 4
    row = group + (8 if i in (2, 3, 6, 7) else 0)
    return row, tig * 2 + (i & 1) + (8 if i >= 4 else 0)


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    """(k, n) of element b_i held by `lane` in the 16 x 8 B tile."""
    group, tig = lane >> 2, lane % 4
    return tig * 2 + (i & 1) + (8 if i >= 2 else 0), group


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of accumulator c_i held by `lane` in the 16 x 8 C/D tile."""
    group, tig = lane >> 2, lane % 4
    return group + (8 if i >= 2 else 0), tig * 2 + (i & 1)


def ldmatrix_x4(addresses, read_row, trans: bool = False):
    """regs[lane][j] = (lo, hi) for matrix j, whose 8 rows lanes 8j..8j+7 address (16 bytes each).
    Plain: lane l gets row l // 4, elements 2 (l % 4), 2 (l % 4) + 1. Trans: lane l gets element
    l // 4 of rows 2 (l % 4) and 2 (l % 4) + 1."""
    regs = []
    for lane in range(32):
        regs.append([])
        for j in range(4):
            if trans:
                rows = [read_row(addresses[8 * j + 2 * (lane % 4) + e]) for e in range(2)]
                regs[lane].append((rows[0][lane // 4], rows[1][lane // 4]))
            else:
                row = read_row(addresses[8 * j + lane // 4])
                regs[lane].append((row[2 * (lane % 4)], row[2 * (lane % 4) + 1]))
    return regs


def bank_groups(addresses) -> list[int]:
    """The 16-byte bank group (of 8) of each shared address: 8 lanes of a 16-byte access phase are
    conflict-free when these are all different."""
    return [(a // 16) % 8 for a in addresses]


class MBarrier:
    """An mbarrier, for the pipeline protocol simulations: the current phase completes when every
    expected arrival has come and the transaction count is back to zero; try_wait.parity(P) succeeds
    once the phase of parity P has completed, i.e. while the current phase's parity differs from P."""

    def __init__(self, arrivals: int):
        self.expected, self.pending, self.tx, self.phase = arrivals, arrivals, 0, 0

    def arrive(self, count: int = 1, expect_tx: int = 0) -> None:
        self.tx += expect_tx
        self.pending -= count
        assert self.pending >= 0, "more arrivals than the barrier expects"
        self.settle()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        assert self.tx >= 0 or self.pending > 0
        self.settle()

    def settle(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.expected

    def ready(self, parity: int, phase_index: int) -> bool:
        """try_wait.parity(parity) by a waiter for the completion of phase `phase_index`."""
        done = (self.phase & 1) != parity
        # The waiter is never two phases behind, or parity could not tell them apart; and the parity
        # it waits on is the one of the phase it means.
        assert self.phase in (phase_index, phase_index + 1), (self.phase, phase_index)
        assert done == (self.phase == phase_index + 1)
        return done


# How a warp_mma block's mma.sync statements are read and run against these models.


def mma_pair_operands(block: str) -> tuple[list[list[str]], list[list[int]]]:
    """The two mma.sync of a warp_mma block's tile-pair loop: each one's four accumulator index
    expressions, and which two of the ldmatrix registers wgmma_bf it takes as b0, b1."""
    mmas = block.split('asm volatile("mma.sync')[1:]
    outputs = [re.findall(r'"\+f"\(\w+\[([^\]]+)\]\)', m) for m in mmas]
    b_slots = [[int(x) for x in re.findall(r'"r"\(wgmma_bf\[(\d)\]\)', m)] for m in mmas]
    assert len(mmas) == 2 and all(len(o) == 4 for o in outputs) and all(len(r) == 2 for r in b_slots)
    return outputs, b_slots


def mma_pair_into(got: dict, warp: int, a_frag: dict, b_regs, operands, index_of) -> None:
    """Run the pair's two m16n8k16 MMAs of one warp on its A fragment ((row, k) -> value) and the
    ldmatrix registers `b_regs`, writing each thread's C elements to got[warp, lane, index], the
    index its statement names (`index_of(expression)`); no accumulator may be written twice."""
    for out, slots in zip(*operands):
        b_frag = {ptx_b(lane, e): b_regs[lane][slots[e // 2]][e % 2] for lane in range(32) for e in range(4)}
        for lane in range(32):
            for i in range(4):
                row, col = ptx_c(lane, i)
                index = index_of(out[i])
                assert (warp, lane, index) not in got, "two MMAs write one accumulator"
                got[warp, lane, index] = sum(a_frag[row, k] * b_frag[k, col] for k in range(16))


def assert_wgmma_d(got: dict, n: int, want) -> None:
    """Every accumulator of the warpgroup's 64 x n D holds want(row, col), in wgmma's layout."""
    for t in range(128):
        for index in range(n // 2):
            row, col = ptx_wgmma_d(t, index)
            assert got[t // 32, t % 32, index] == want(row, col), (t, index)
