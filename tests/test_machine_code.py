"""Whether two kernel states run the same machine code (klineage.gate.machine_code), with real nvcc and
cuobjdump on kernels written for the test from the bundled naive softmax."""

from __future__ import annotations

import dataclasses

from klineage import corpus
from klineage.features import sass
from klineage.gate import machine_code as machine_code_module
from klineage.gate.machine_code import CodeIdentity, machine_code, same_machine_code
from klineage.kernel import KernelState
from klineage.toolchain import find_toolchain

NAIVE = corpus.kernel_entry("row_softmax/naive").load()


def _edited(old: str, new: str, state: KernelState = NAIVE) -> KernelState:
    assert state.source.count(old) == 1, old
    return state.with_source(state.source.replace(old, new))


def test_a_renamed_local_and_a_launch_bound_nvcc_already_met_run_the_same_code():
    renamed = _edited("const float row_max = partial[0];", "const float largest = partial[0];")
    renamed = renamed.with_source(renamed.source.replace("- row_max)", "- largest)"))
    assert renamed.fingerprint != NAIVE.fingerprint
    assert same_machine_code(NAIVE, renamed) is CodeIdentity.SAME
    assert machine_code(NAIVE).digest() == machine_code(renamed).digest()  # what the step census compares
    bounded = _edited("row_softmax_naive(const float*", "__launch_bounds__(256) row_softmax_naive(const float*")
    assert same_machine_code(NAIVE, bounded) is CodeIdentity.SAME


def test_other_instructions_other_resources_or_another_launch_are_different_code():
    fast = _edited("s += expf(xr[c] - row_max)", "s += __expf(xr[c] - row_max)")
    assert same_machine_code(NAIVE, fast) is CodeIdentity.DIFFERENT
    assert machine_code(NAIVE).digest() != machine_code(fast).digest()
    # the same cubin launched with half the threads: what runs is not the same
    launch = dataclasses.replace(NAIVE.plan.launches[0], block=(128, 1, 1))
    halved = KernelState(source=NAIVE.source, plan=dataclasses.replace(NAIVE.plan, launches=(launch,)))
    code, other = machine_code(NAIVE), machine_code(halved)
    assert code.sass == other.sass and code.resources == other.resources
    assert same_machine_code(NAIVE, halved) is CodeIdentity.DIFFERENT
    # a plan's name and description are words for people: they change nothing that runs
    renamed = KernelState(source=NAIVE.source, plan=dataclasses.replace(NAIVE.plan, name="softmax_copy",
                                                                         description="the same kernel"))
    assert same_machine_code(NAIVE, renamed) is CodeIdentity.SAME


def test_a_kernel_that_does_not_compile_leaves_the_question_open():
    broken = _edited("float s = 0.0f;", "float s = 0.0f +;")
    assert machine_code(broken) is None
    assert same_machine_code(NAIVE, broken) is CodeIdentity.UNCHECKED


def test_a_toolchain_that_cannot_disassemble_leaves_the_question_open(monkeypatch):
    broken = dataclasses.replace(find_toolchain(), cuobjdump="/bin/false")  # a cuobjdump that fails
    monkeypatch.setattr(machine_code_module, "disassemble", lambda cubin: sass.disassemble(cubin, broken))
    assert machine_code(NAIVE) is None
    assert same_machine_code(NAIVE, NAIVE) is CodeIdentity.UNCHECKED
