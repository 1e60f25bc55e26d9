"""Run a golden elementwise kernel on the CPU (tests/transforms/elementwise_emulator.cpp over tests/mma_emulator.h):
build it once per source, run its plan for some parameters, read its output buffers back.

A build is almost all the emulator's own code (about 2 s, the kernel a small part of it), so the tests that compare
forms build them two at a time (`builds`): each form's source sits in a namespace of its own, its entry called as
written, the first form's as the emulator's `kernel`, the second's as its SECOND_ENTRY. A form whose plan launches a
second entry of its own (a split reduction's merge) is built alone."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from klineage import devices
from klineage.kernel import KernelState, parse_constants
from klineage.launch import resolve
from tests.cuda_tools import build_mma_emulator, run_mma_emulator

EMULATOR = Path(__file__).resolve().parent / "elementwise_emulator.cpp"


def build(work: Path, state: KernelState) -> Path:
    """The emulator of the state's kernel `kernel` and, where its plan launches one more entry, that one."""
    work.mkdir(parents=True, exist_ok=True)
    others = sorted({launch.entry for launch in state.plan.launches} - {"kernel"})
    assert len(others) <= 1, f"the emulator runs `kernel` and at most one more entry, not {others}"
    return build_mma_emulator(work, EMULATOR, state.source, (), *(f"SECOND_ENTRY={name}" for name in others))


_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.M)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)


def _entry(state: KernelState) -> str | None:
    entries = {launch.entry for launch in state.plan.launches}
    return next(iter(entries)) if len(entries) == 1 else None


def _renamed(state: KernelState, entry: str) -> KernelState:
    """The state with its plan launching `entry`: the name its kernel has in the shared build."""
    launches = tuple(replace(launch, entry=entry) for launch in state.plan.launches)
    return KernelState(source=state.source, plan=replace(state.plan, launches=launches))


def _pair(work: Path, first: KernelState, second: KernelState) -> tuple[Path, KernelState, KernelState]:
    """One build of both forms (their includes first, outside the namespaces; each form's macros undefined after
    it, so the other sees only its own) and the two states to run on it."""
    work.mkdir(parents=True, exist_ok=True)
    includes = dict.fromkeys(line.strip() for state in (first, second) for line in _INCLUDE.findall(state.source))
    parts = ["\n".join(includes) + "\n"]
    for space, state in (("first_form", first), ("second_form", second)):
        parts.append(f"namespace {space} {{\n{_INCLUDE.sub('', state.source)}\n}}  // namespace {space}\n")
        parts += [f"#undef {macro}\n" for macro in dict.fromkeys(_DEFINE.findall(state.source))]
    parts.append(f"static constexpr auto kernel = &first_form::{_entry(first)};\n")
    second_entry = f"second_form::{_entry(second)}"
    binary = build_mma_emulator(work, EMULATOR, "".join(parts), (), f"SECOND_ENTRY={second_entry}")
    return binary, _renamed(first, "kernel"), _renamed(second, second_entry)


def builds(work: Path, forms: dict[str, KernelState]) -> dict[str, tuple[Path, KernelState]]:
    """Each form's emulator and the state to run on it, the forms built two at a time in their order (a form of two
    entries, and an odd one out, alone)."""
    built: dict[str, tuple[Path, KernelState]] = {}
    waiting: list[str] = []
    for name, state in forms.items():
        if _entry(state) is None:
            built[name] = (build(work / name, state), state)
            continue
        waiting.append(name)
        if len(waiting) == 2:
            first, second = waiting
            binary, one, two = _pair(work / f"{first}+{second}", forms[first], forms[second])
            built[first], built[second] = (binary, one), (binary, two)
            waiting = []
    for name in waiting:
        built[name] = (build(work / name, forms[name]), forms[name])
    return {name: built[name] for name in forms}


def run(binary: Path, work: Path, state: KernelState, params: dict, inputs: dict[str, torch.Tensor],
        outputs: dict[str, tuple[torch.dtype, int]], shift: int = 0, order: str = "random",
        starting: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The outputs (name -> dtype, count) of the state's plan for `params` on `inputs`, every buffer argument
    `shift` elements into its buffer (the first `shift` elements of each buffer are padding); an output named in
    `starting` starts from those values (else every byte is 0xFF)."""
    work.mkdir(parents=True, exist_ok=True)
    launches = []
    env = {**devices.DEFAULT.facts(), **parse_constants(state.source), **params}  # a plan may size by the GPU
    for launch in resolve(state.plan, env, set(inputs) | set(outputs)):
        args = tuple(("scalar", struct.unpack("<i", struct.pack("<f", float(value)))[0], "i32")
                     if kind == "scalar" and kind_type == "f32" else (kind, value, kind_type)
                     for kind, value, kind_type in launch.args)
        launches.append(replace(launch, args=args))
    padded = {name: torch.cat([torch.zeros(shift, dtype=t.dtype), t]) for name, t in inputs.items()}
    for name, values in (starting or {}).items():  # outputs a kernel adds to start from these, not from 0xFF bytes
        start = torch.cat([torch.zeros(shift, dtype=values.dtype), values])
        (work / f"{name}.bin").write_bytes(start.contiguous().view(torch.uint8).numpy().tobytes())
    buffers = [f"{name} {str(dtype).removeprefix('torch.')} {count + shift} "
               f"{'inout' if name in (starting or {}) else 'output'}" for name, (dtype, count) in outputs.items()]
    complaint = run_mma_emulator(binary, work, padded, buffers, launches, order, 7, shift)
    assert not complaint, complaint
    return {name: torch.frombuffer(bytearray((work / f"{name}.bin").read_bytes()), dtype=dtype)[shift:]
            for name, (dtype, _) in outputs.items()}


def differences(work: Path, naive: KernelState, sources: dict[str, KernelState], shapes: tuple[tuple[int, ...], ...],
                inputs_of: Callable[..., tuple[dict, dict, dict]]) -> list[str]:
    """Where the forms of `sources` compute other bits than `naive` (empty when nowhere), for each shape (the
    arguments of `inputs_of`, which gives (params, inputs, outputs), and where outputs are added to, the values they
    start from) on aligned and misaligned (shift 1) pointers; the forms built two at a time."""
    binaries = builds(work, {"naive": naive, **sources})
    found = []
    for shape in shapes:
        params, inputs, outputs, *starting = inputs_of(*shape)
        for shift in (0, 1):
            folder = "x".join(map(str, shape)) + f"-{shift}"
            binary, state = binaries["naive"]
            start = starting[0] if starting else None
            want = run(binary, work / f"naive-{folder}", state, params, inputs, outputs, shift, starting=start)
            for name in sources:
                binary, state = binaries[name]
                got = run(binary, work / f"{name}-{folder}", state, params, inputs, outputs, shift, starting=start)
                found += [f"{name} {folder} {out}" for out in outputs
                          if not torch.equal(got[out].view(torch.uint8), want[out].view(torch.uint8))]
    return found


def same_product_bits(naive: KernelState, tiled: KernelState, tmp_path: Path, inputs_of, output: str, batch: int = 1,
                      **scalars) -> None:
    """For a matrix product (parameters m, n, k; `inputs_of(m, n, k, generator)` its inputs): the tiled kernel's
    output bits are the naive kernel's, for sizes 16 does and does not divide (and, with `batch`, for every matrix
    of a batch); both forms in one build."""
    binaries = builds(tmp_path, {"naive": naive, "tiled": tiled})
    nonzero = 0
    for m, n, k in ((1, 1, 1), (5, 7, 3), (16, 16, 16), (33, 17, 40), (20, 50, 70)):
        inputs = inputs_of(m, n, k, torch.Generator().manual_seed(m * 10000 + n * 100 + k))
        params = {"m": m, "n": n, "k": k, "batch": batch, **scalars}
        runs = {form: run(binary, tmp_path / f"{form}-{m}x{n}x{k}", state, params, inputs,
                                  {output: (torch.float32, batch * m * n)})[output]
                for form, (binary, state) in binaries.items()}
        assert torch.equal(runs["tiled"].view(torch.int32), runs["naive"].view(torch.int32)), (m, n, k)
        nonzero += int((runs["naive"] != 0).sum())
    assert nonzero > 500  # of the 1,853 outputs (a relu zeroes about half): their bits were compared


def hard_rows(n: int, g: torch.Generator) -> torch.Tensor:
    """Rows of n columns that a (value, index) combine can get wrong: ties within and across lanes, NaNs at the
    start and inside, infinities, signed zeros, the best in the last column."""
    randn, nan, inf = (lambda: torch.randn(n, generator=g)), float("nan"), float("inf")
    ties = torch.randint(0, 3, (n,), generator=g).float()
    nan_first, nan_inside, late = randn(), randn(), torch.full((n,), -1.0)
    nan_first[0], nan_inside[::7], late[-1] = nan, nan, 5.0
    zeros = torch.where(torch.rand(n, generator=g) < 0.5, -0.0, 0.0)
    lone = torch.full((n,), -inf)
    lone[-1] = -3.0
    infinities = torch.where(torch.rand(n, generator=g) < 0.3, inf, -inf)
    return torch.stack([randn(), ties, -ties, nan_first, nan_inside, torch.full((n,), -inf), lone, zeros,
                        torch.full((n,), nan), late, infinities, torch.zeros(n)])
