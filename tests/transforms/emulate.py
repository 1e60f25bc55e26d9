"""Run a golden elementwise kernel on the CPU (tests/transforms/elementwise_emulator.cpp over tests/mma_emulator.h):
build it once per source, run its plan for some parameters, read its output buffers back."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

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


def run(binary: Path, work: Path, state: KernelState, params: dict, inputs: dict[str, torch.Tensor],
        outputs: dict[str, tuple[torch.dtype, int]], shift: int = 0, order: str = "random",
        starting: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The outputs (name -> dtype, count) of the state's plan for `params` on `inputs`, every buffer argument
    `shift` elements into its buffer (the first `shift` elements of each buffer are padding); an output named in
    `starting` starts from those values (else every byte is 0xFF)."""
    work.mkdir(parents=True, exist_ok=True)
    launches = []
    for launch in resolve(state.plan, {**parse_constants(state.source), **params}, set(inputs) | set(outputs)):
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
    arguments of `inputs_of`, which gives (params, inputs, outputs)) on aligned and misaligned (shift 1) pointers."""
    binaries = {name: build(work / name, state) for name, state in {"naive": naive, **sources}.items()}
    found = []
    for shape in shapes:
        params, inputs, outputs = inputs_of(*shape)
        for shift in (0, 1):
            folder = "x".join(map(str, shape)) + f"-{shift}"
            want = run(binaries["naive"], work / f"naive-{folder}", naive, params, inputs, outputs, shift)
            for name, state in sources.items():
                got = run(binaries[name], work / f"{name}-{folder}", state, params, inputs, outputs, shift)
                found += [f"{name} {folder} {out}" for out in outputs
                          if not torch.equal(got[out].view(torch.uint8), want[out].view(torch.uint8))]
    return found


def same_product_bits(naive: KernelState, tiled: KernelState, tmp_path, inputs_of, output: str, batch: int = 1,
                      **scalars) -> None:
    """For a matrix product (parameters m, n, k; `inputs_of(m, n, k, generator)` its inputs): the tiled kernel's
    output bits are the naive kernel's, for sizes 16 does and does not divide (and, with `batch`, for every matrix
    of a batch)."""
    binaries = {"naive": build(tmp_path / "naive", naive), "tiled": build(tmp_path / "tiled", tiled)}
    nonzero = 0
    for m, n, k in ((1, 1, 1), (5, 7, 3), (16, 16, 16), (33, 17, 40), (20, 50, 70)):
        inputs = inputs_of(m, n, k, torch.Generator().manual_seed(m * 10000 + n * 100 + k))
        params = {"m": m, "n": n, "k": k, "batch": batch, **scalars}
        runs = {form: run(binary, tmp_path / f"{form}-{m}x{n}x{k}", {"naive": naive, "tiled": tiled}[form],
                                  params, inputs, {output: (torch.float32, batch * m * n)})[output]
                for form, binary in binaries.items()}
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
