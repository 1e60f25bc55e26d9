"""Whether two kernel states run the same machine code.

Two states run the same code when every function of their cubins has the same SASS and the same
resources from ptxas (registers, barriers, stack, spills, static shared memory, constant banks) and
their launch plans launch it alike (arch, flags, scratch, launches and the cases it supports; a plan's
name, description and source file name change nothing that runs). Such a pair times alike up to the
noise, so a step between them has a true ratio of 1: a `restrict` nvcc had already inferred, an unroll
it had already done, a `__launch_bounds__` that changes no register allocation.

The walk's timing audit reads this to tell an artifact of the pairing from an effect; the optimize loop
reads it to spend no gate call on a candidate that cannot be a step, and admission to trial a card only where
its kernel is not the target's own code. Kernels compile here, in the compiler's sandbox and through the
compile cache the gate uses, so a kernel the gate compiles anyway is compiled once. Where a kernel does not
compile, or this machine's toolchain cannot compile or disassemble it, nothing is known (UNCHECKED) and each
reader does as it did without the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from klineage import config
from klineage.errors import ToolchainError
from klineage.features.sass import disassemble
from klineage.fingerprint import sha256_json
from klineage.gate.compile import compile_kernel
from klineage.kernel import KernelState

# What a plan holds that does not change what runs: names and words for people, the source file's name.
_PLAN_LABELS = frozenset({"name", "description", "source"})


class CodeCheck(str, Enum):
    """What is compared before a kernel is gated against another (the optimize loop's candidate against its best,
    admission's card kernel against its held-out target)."""

    NONE = "none"  # nothing: every kernel is gated (runs and admissions from before the check)
    # whether the kernel runs the other's machine code: one that does is not gated, since its true ratio is 1
    # and no paired ratio could take it (the loop records it same_code; admission finds it no target)
    SASS = "sass"


class CodeIdentity(str, Enum):
    SAME = "same"  # the same machine code, launched alike: the true ratio is 1
    DIFFERENT = "different"
    UNCHECKED = "unchecked"  # one of the two does not compile: nothing is known


@dataclass(frozen=True)
class MachineCode:
    """What a kernel state runs: per function its SASS and resources, and how its plan launches it."""

    sass: dict[str, list[str]]
    resources: dict[str, dict[str, int]]
    launch: dict[str, Any]

    def digest(self) -> str:
        """A content digest: two machine codes are equal exactly when their digests are (what the step census
        compares, its kernels compiled in other processes)."""
        return sha256_json([self.sass, self.resources, self.launch])


def machine_code(kernel: KernelState) -> MachineCode | None:
    """The state's machine code on its plan's arch, compiled here; None if it does not compile, or the
    toolchain here cannot compile or disassemble it."""
    try:
        compiled = compile_kernel(kernel, cache_dir=config.cache_dir())
        if not compiled.ok:
            return None
        arch = kernel.plan.arch
        sass = disassemble(compiled.cubin_bytes(arch))
    except ToolchainError:
        return None
    resources = {name: used.to_dict() for name, used in compiled.resources.get(arch, {}).items()}
    launch = {key: value for key, value in kernel.plan.to_dict().items() if key not in _PLAN_LABELS}
    return MachineCode(sass, resources, launch)


def identity(first: MachineCode | None, second: MachineCode | None) -> CodeIdentity:
    if first is None or second is None:
        return CodeIdentity.UNCHECKED
    return CodeIdentity.SAME if first == second else CodeIdentity.DIFFERENT


def same_machine_code(first: KernelState, second: KernelState) -> CodeIdentity:
    return identity(machine_code(first), machine_code(second))
