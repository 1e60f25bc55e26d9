"""Golden before/after checks shared by every transform's tests.

A transform's folder `tests/transforms/<name>/` holds `before.cu` (the expert form) and
`after.cu` (the simplified form; absent where only the plan changes), optionally `before.toml`/`after.toml` when
the plan changes.
`backward(before) == after`, `forward(after) == before` where a forward exists, both parse,
and both compile with nvcc for sm_90 (they are complete kernels, not fragments).
"""

from __future__ import annotations

from pathlib import Path

from klineage.features.cuda_parser import syntax_errors
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import Direction, get

HERE = Path(__file__).resolve().parent
DEFAULT_PLAN = """
name = "golden"
problem = "golden"
[[launch]]
entry = "{entry}"
grid = [1]
block = [128]
"""


def plan_of(args: str, grid: str = "cdiv(n, 256)", block: int = 256) -> LaunchPlan:
    """A one-launch plan of `kernel` for a test's own small kernel: its TOML argument list, grid and block."""
    return LaunchPlan.from_toml(f'name = "t"\nproblem = "t"\n[[launch]]\nentry = "kernel"\ngrid = ["{grid}"]\n'
                                f"block = [{block}]\nargs = [{args}]\n")


def edited(source: str, plan: str, old: str, new: str) -> KernelState:
    """The kernel `source` launched by the plan text `plan`, `old` replaced by `new` in the plan where it stands
    there, else in the source (where it must stand)."""
    if old in plan:
        return KernelState(source=source, plan=LaunchPlan.from_toml(plan.replace(old, new)))
    assert old in source, old
    return KernelState(source=source.replace(old, new), plan=LaunchPlan.from_toml(plan))


def load(case: Path, which: str, entry: str) -> KernelState:
    """The case's `which` form; a transform that changes only the plan keeps one `before.cu` for both."""
    plan_file = case / f"{which}.toml"
    plan_text = plan_file.read_text() if plan_file.is_file() else DEFAULT_PLAN.format(entry=entry)
    source = case / f"{which}.cu"
    source = source if source.is_file() else case / "before.cu"
    return KernelState(source=source.read_text(), plan=LaunchPlan.from_toml(plan_text))


def check_golden(name: str, case: str = "", entry: str = "kernel") -> None:
    folder = HERE / name / case if case else HERE / name
    transform = get(name)
    before, after = load(folder, "before", entry), load(folder, "after", entry)
    anchors = transform.find(before)
    assert anchors, f"{name} finds no site in {folder}/before.cu"
    rewrite = transform.backward(before, anchors[0])
    assert rewrite.direction is Direction.BACKWARD
    assert rewrite.state.source == after.source, f"{name}: backward(before) differs from after.cu"
    assert rewrite.state.plan == after.plan, f"{name}: backward(before) plan differs from after.toml"
    assert not syntax_errors(rewrite.state.source)
    if transform.has_forward:
        undone = transform.forward(after, rewrite.anchor)
        assert undone.state.source == before.source, f"{name}: forward(after) differs from before.cu"
        assert undone.state.plan == before.plan


def compiles_without_spills(state: KernelState, cache: Path):
    """Compile with the gate's own nvcc stage; every entry must build and keep its values in registers."""
    from klineage.gate.compile import compile_kernel

    result = compile_kernel(state, cache)
    assert result.ok, result.log[-3000:]
    for launch in state.plan.launches:
        resources = result.resources_for(launch.entry)
        assert not resources.spills, f"{launch.entry} spills: {resources}"
    return result


def assert_packs_are_128_bit(naive: KernelState, packed: KernelState, cache: Path, loads: int = 1) -> None:
    """Both forms compile without spills; the packed one moves global memory in 128-bit loads and stores (SASS
    LDG.E.128 and STG.E.128; at least `loads` loads: one per array it packs), the naive one in none."""
    from tests.cuda_tools import feature_counts

    before, after = (feature_counts(compiles_without_spills(state, cache)) for state in (naive, packed))
    assert before.get("ldg_128", 0) == 0 and before.get("stg_128", 0) == 0
    assert after.get("ldg_128", 0) >= loads and after.get("stg_128", 0) >= 1, after
