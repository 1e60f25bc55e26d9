"""serialize_block_reduction: a block that shares one row's passes becomes one thread that makes them alone.

The mechanism (forward): serialize_reduction's, a block a row instead of a warp, for rows too long and too few to
keep the GPU busy a warp each (a softmax over 16 rows of 16,384 columns is 16 warps). The kernel with one thread per
row takes its row from the block (`int row = blockIdx.x;`), each of BLOCK threads takes the columns j = lane, lane
+ BLOCK, ... (`const int lane = threadIdx.x;`), and every scalar a loop reduces into (a sum, a product, an extreme:
serialize_reduction lists the spellings) is combined right after its loop: a butterfly of `__shfl_xor_sync` within
each warp, then each warp's first lane writes the warp's value to a shared array of one slot a warp, and after a
barrier every thread folds the slots in warp order, so each holds the same value (the order is fixed: runs agree to
the bit); a second barrier lets the slots be written again. The launch becomes one block of BLOCK threads a row:
the grid is the row count, read from the guard that holds every row's work (`if (row >= N) return;`, or `if (row <
N) { ... }` ending the kernel, right after its declarations; N in the plan's terms, never changed by the kernel),
its y and z kept.

Every thread of a block computes the same values outside the loops (nothing there tells them apart), so every
branch there goes the same way in all of them and each barrier is reached by the whole block.

Backward serializes the canonical form forward writes: the row index is the global thread index again, the lane
line, the butterflies and the exchanges go, the loops start where they started and step by one; the launch becomes
one thread a row on blocks of BLOCK (cdiv(grid, BLOCK) blocks).

A loop that keeps a best value with its index, an online maximum with its rescaled sum or Welford's triple joins
its lanes' tuples by the warp's butterfly, then each warp's tuple goes to a shared slot and every thread joins the
eight slots in order (`exchange`): the joins give the same tuple in whichever order they run, so every thread ends
with the row's.

Legality (forward_sites): serialize_reduction's (`_warp_reduction.py`), the loops reductions only: a running sum or
product (a scan) is refused here (its lanes would need the block's earlier lanes' totals); the rows bounded by a
guard on the row index, which every launch passes in scalars.
Anchor: the kernel, kind "function", key the row variable.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.launch import Launch, LaunchPlan
from klineage.transforms import register
from klineage.transforms._arg_reduction import ArgBest, pair_join
from klineage.transforms._canonical import NARROW
from klineage.transforms._naive import launch_scalars, squash, statements
from klineage.transforms._online_max import OnlineMax, online_join
from klineage.transforms._row_count import check_fixed, guard_count, plan_value
from klineage.transforms._warp_reduction import (
    LANE,
    WARP,
    Accumulator,
    Layout,
    Site,
    WarpReduction,
)
from klineage.transforms._welford import Welford, welford_join
from klineage.transforms.base import NotApplicable, with_plan

BLOCK = 256  # threads a row: eight warps, a column in eight loads of 32 lanes where a row is 2,048 long
_WARPS = BLOCK // WARP
_WARP_SLOT = "block_warp"  # the loop over the warps' slots that joins their tuples


@dataclass(frozen=True)
class BlockLayout(Layout):
    """Every thread of a block shares one row: its loops stride by the block, its reductions combine through the
    warps' shuffles (the lane, mask and butterfly of a warp a row) and a shared slot a warp."""

    group: int = 1

    @property
    def sharing(self) -> int:
        return BLOCK

    def index(self, kind: str = NARROW) -> str:
        return "blockIdx.x" if kind == NARROW else "(long long)blockIdx.x"

    @property
    def lines(self) -> tuple[str, ...]:
        return (f"const int {LANE} = threadIdx.x;",)

    def combine(self, acc: Accumulator, kind: str, indent: str) -> str:
        slots = [f"block_{acc.name}[{w}]" for w in range(_WARPS)]
        if acc.combine in ("+", "*"):
            folded = f" {acc.combine} ".join(slots)
        else:
            folded = slots[0]
            for slot in slots[1:]:
                folded = f"{acc.combine}({folded}, {slot})"
        inner = indent + "    "
        return (f"{super().combine(acc, kind, indent)}\n{indent}{{\n"
                f"{inner}__shared__ {kind} block_{acc.name}[{_WARPS}];\n"
                f"{inner}if ({LANE} % {WARP} == 0) block_{acc.name}[{LANE} / {WARP}] = {acc.name};\n"
                f"{inner}__syncthreads();\n"
                f"{inner}{acc.name} = {folded};\n"
                f"{inner}__syncthreads();\n{indent}}}")

    def is_exchange(self, text: str) -> bool:
        single = re.match(rf"^{{ __shared__ [\w ]+ block_(\w+)\[{_WARPS}\]; if \({LANE} % {WARP} == 0\) "
                          rf"block_\1\[{LANE} / {WARP}\] = \1; __syncthreads\(\); \1 = [^;]+; __syncthreads\(\); }}$",
                          text)
        return single is not None or _is_joint_exchange(self, text)

    def exchange(self, names: tuple[str, ...], kinds: tuple[str, ...], join: Callable[[list[str]], list[str]],
                 indent: str) -> str:
        """Each warp's joined tuple through a shared slot a warp, then every thread joins the slots in order into
        warp 0's (`join`'s statements: the same tuple in every thread)."""
        stores = [f"    block_{name}[{LANE} / {WARP}] = {name};" for name in names]
        joined = join([f"block_{name}[{_WARP_SLOT}]" for name in names])
        slots = [f"    __shared__ {kind} block_{name}[{_WARPS}];" for name, kind in zip(names, kinds, strict=True)]
        lines = ["{", *slots,
                 f"    if ({LANE} % {WARP} == 0) {{", *(f"    {line}" for line in stores), "    }",
                 "    __syncthreads();", *(f"    {name} = block_{name}[0];" for name in names),
                 f"    for (int {_WARP_SLOT} = 1; {_WARP_SLOT} < {_WARPS}; ++{_WARP_SLOT}) {{",
                 *(f"        {line}" for line in joined), "    }", "    __syncthreads();", "}"]
        return "".join(f"\n{indent}{line}" for line in lines)


def _is_joint_exchange(layout: BlockLayout, text: str) -> bool:
    """Whether `text` (squashed) is what `exchange` writes for an arg reduction's pair, an online maximum's or
    Welford's triple: rebuilt from the shared slots it declares, each join that takes that many, and compared."""
    slots = re.findall(rf"__shared__ ([\w ]+?) block_(\w+)\[{_WARPS}\];", text)
    if not text.startswith("{ __shared__") or f"for (int {_WARP_SLOT} = 1;" not in text or len(slots) not in (2, 3):
        return False
    kinds, names = tuple(kind for kind, _ in slots), tuple(name for _, name in slots)
    if len(names) == 3:
        joins = [partial(welford_join, Welford(*names), dict(zip(names, kinds, strict=True)))]
    else:
        joins = [*(partial(pair_join, ArgBest(*names, compare)) for compare in ("<", ">", "<=", ">=")),
                 *(partial(online_join, OnlineMax(*names, exp), kinds[0]) for exp in ("expf", "__expf", "exp"))]
    return any(squash(layout.exchange(names, kinds, lambda other, join=join: join(*other), "")) == text
               for join in joins)


class SerializeBlockReduction(WarpReduction):
    name = "serialize_block_reduction"
    intent = ("Give each row a block instead of a thread: its threads stride the row's loops and combine what the "
              "loops reduce through warp shuffles and a shared slot a warp, for rows too few to fill the GPU a "
              "warp each.")
    layout = BlockLayout()
    carrier = {"block": BLOCK}
    removes = ("shfl", "shared_array", "syncthreads")
    # Not proposed by the warp-shuffle cards: taken first in their path it leaves the warp form's row cache no site.
    # It paid 11.37x the warp form on 16 long rows, but on 16,384 rows about what the warp form and its cache reach
    # (H200): the catalog offers it, weighed as a rival.
    lent = False
    launch_note = f"one block of {BLOCK} a row, the grid the row count"
    serial_launch_note = f"one thread a row on blocks of {BLOCK}"

    def _check_direction(self, parsed: cp.ParsedSource, site: Site) -> None:
        if any(loop.scan is not None for loop in site.loops):
            raise NotApplicable(f"{site.function.name} keeps a running sum, which a block form does not scan (its "
                                f"lanes would need the block's earlier totals)")
        _row_count(parsed, site.function, site.row)  # the grid a block a row takes

    def _shared_plan(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                     site: Site) -> LaunchPlan:
        count, constants = _row_count(parsed, function, site.row), parse_constants(state.source)
        launches = []
        for launch in state.plan.launches:
            if launch.entry == function.name:
                rows = plan_value(count, launch_scalars(parsed, function, launch), constants)
                launch = Launch(launch.entry, (rows, *launch.grid[1:]), (BLOCK, 1, 1), launch.shared, launch.args)
            launches.append(launch)
        return with_plan(state, launches=tuple(launches))

    def _serial_plan(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                     row: str) -> LaunchPlan:
        launches = tuple(Launch(launch.entry, (f"cdiv({str(launch.grid[0]).strip()}, {BLOCK})",
                                               *launch.grid[1:]), (BLOCK, 1, 1), launch.shared, launch.args)
                         if launch.entry == function.name else launch for launch in state.plan.launches)
        return with_plan(state, launches=launches)


def _row_count(parsed: cp.ParsedSource, function: cp.Function, row: str) -> str:
    """N of the guard that holds every row's work: the first statement after the kernel's declarations, `if (row >=
    N) return;` or `if (row < N) { ... }` ending the kernel, N a count the plan can say that the kernel never changes.
    Launched as N blocks, the rows below N run as they did and no other row runs, which is all the naive kernel's
    guard let do anything."""
    body = function.node.child_by_field_name("body")
    listed = statements(body)
    guard = next((s for s in listed if s.type != "declaration"), None)
    if guard is not None and guard.type == "if_statement" and guard.child_by_field_name("alternative") is None:
        then = squash(parsed.text(guard.child_by_field_name("consequence")))
        count = guard_count(parsed, guard, row, (">=", "<=")) if then in ("return;", "{ return; }") else \
            guard_count(parsed, guard, row, ("<", ">")) if guard == listed[-1] else None
        if count:
            check_fixed(parsed, body, count)
            return count
    raise NotApplicable(f"{function.name} holds its rows' work under no guard `if ({row} >= N) return;` or `if "
                        f"({row} < N) {{ ... }}` after its declarations: a block a row needs the row count N")


register(SerializeBlockReduction())
