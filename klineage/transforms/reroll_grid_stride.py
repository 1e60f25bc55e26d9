"""reroll_grid_stride: a grid-stride loop unrolled U grids a step becomes the plain loop; forward finds its sites
by analysis.

The mechanism (forward): every loop of a kernel that strides over the grid a thread at a time (`_grid_free`'s
thread form) takes U of its elements a step, a grid apart; a step whose last element is in range runs them all
unguarded, and only the last step guards each element:

    for (T i_base = <start>; i_base < <bound>; i_base += U * (<stride>)) {
        if (i_base + <U - 1> * (<stride>) < <bound>) {
    #pragma unroll
            for (int i_step = 0; i_step < U; ++i_step) {
                const T i = i_base + i_step * (<stride>);
                <work>
            }
        } else {
    #pragma unroll
            for (int i_step = 0; i_step < U; ++i_step) {
                const T i = i_base + i_step * (<stride>);
                if (i < <bound>) <work>
            }
        }
    }

A thread visits the same elements in the same order as before, so the kernel computes exactly what it did; what
changes is that the U elements' loads no longer wait on each other's loop test, and nvcc issues them together: more
loads in flight a thread where more blocks would not help (bench/variants/grid_stride_unroll: 1.08x on mse_loss's
float4 loop on an H100, where 4x the blocks gave 0.96x). The full steps run unguarded because a guard per element
keeps nvcc from moving an element's load above the branches of the element before it: with every element guarded,
softplus's loop (whose work branches on the value) had one load in flight where nvcc's own unrolling of the plain
loop had two, and was 0.857x on an H100 (docs/forwards.md); unguarded, the full step's loads are issued back to back
in SASS. U is the carrier `factor`: a card's values, else 2 (4 measured no better on mse_loss).

Legality, decided on the parse: the loop reads as `_grid_free` reads a thread's grid-stride loop (start, `i < n`
with n never assigned, the grid's extent as the step), its work never assigns the index, leaves the loop
(`break`, `return`, `goto`; `continue` moves to the next element either way) or waits at a barrier, and the
kernel declares neither `i_base` nor `i_step`. Known limit: `i_base` steps U grids past the bound where the plain
index stepped one, so an `int` index wraps U times sooner near 2^31 elements. The work is written twice, so the
kernel's code grows by one copy of it.

Backward writes the plain loop (`i += <stride>`) back from every loop of the kernel unrolled by the anchor's U; a
work without braces goes on a line of its own. It applies only where the forward would write this kernel again from
the plain one: an unrolled work that leaves its loop (a `break` leaves only the inner one) is refused.

Anchor: the kernel, kind "function", key `loops*<U>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._c_style import c_style
from klineage.transforms._edit import indentation, reindent, splice
from klineage.transforms._grid_free import STEP, StridedLoop, block_names, strided_loops, unrolled_loops
from klineage.transforms._naive import kernel, readable
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

FACTOR = 2
_KEY = re.compile(r"^loops\*(?P<factor>[1-9]\d*)$")


def _plain(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> list[StridedLoop]:
    """The kernel's thread-form grid-stride loops (none inside another), or NotApplicable with the reason."""
    left_out: list[str] = []
    loops = [loop for loop in strided_loops(parsed, function, block_names(state, function.name), left_out)
             if loop.form == "thread"]
    if not loops:
        raise NotApplicable(f"{function.name} has no loop that strides over the grid a thread at a time"
                            + "".join(f"; {why}" for why in left_out))
    for loop in loops:
        if any(other is not loop and other.loop.start_byte <= loop.loop.start_byte < other.loop.end_byte
               for other in loops):
            raise NotApplicable(f"{function.name}'s loop over '{loop.index}' is inside another grid-stride loop")
    declared = set(re.findall(r"\b([A-Za-z_]\w*_(?:base|step))\b", parsed.text(function.node)))
    if clash := sorted(declared & {f"{loop.index}_{part}" for loop in loops for part in ("base", "step")}):
        raise NotApplicable(f"{function.name} already names '{clash[0]}'")
    return loops


class RerollGridStride(Transform):
    name = "reroll_grid_stride"
    intent = ("Unroll a grid-stride loop a few grids a step, the last step's elements each under its own guard, so "
              "that a thread issues the loads of several elements together.")
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        found = []
        for function in cp.functions(parsed):
            for factor in dict.fromkeys(u for _, u, _ in unrolled_loops(parsed, function)):
                found.append(Anchor(function.name, "function", f"loops*{factor}"))
        return found

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        state = c_style(state)  # C's loops as the forwards read them
        parsed = cp.parse(state.source)
        factors = self.carrier_counts(carrier, "factor", above=1) or [FACTOR]
        return [Anchor(function.name, "function", f"loops*{factor}", parsed.text(loops[0].loop)[:200])
                for function, loops in readable(parsed, lambda f: _plain(state, parsed, f)) for factor in factors]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        factor = _key(anchor)
        state = c_style(state)
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        edits = []
        for loop in _plain(state, parsed, function):
            indent = indentation(parsed.data, loop.loop.start_byte)
            i, split, inner, body = loop.index, indent + STEP, indent + 2 * STEP, indent + 3 * STEP
            work = reindent(parsed.text(loop.work), len(indent), body).removeprefix(body)

            def step(guard: str) -> str:
                return (f"#pragma unroll\n{inner}for (int {i}_step = 0; {i}_step < {factor}; ++{i}_step) {{\n"
                        f"{body}const {loop.kind} {i} = {i}_base + {i}_step * ({loop.stride});\n"
                        f"{body}{guard}{work}\n{inner}}}\n")
            edits.append((loop.loop.start_byte, loop.loop.end_byte,
                          f"for ({loop.kind} {i}_base = {loop.start}; {i}_base < {loop.bound}; "
                          f"{i}_base += {factor} * ({loop.stride})) {{\n"
                          f"{split}if ({i}_base + {factor - 1} * ({loop.stride}) < {loop.bound}) {{\n{step('')}"
                          f"{split}}} else {{\n{step(f'if ({i} < {loop.bound}) ')}{split}}}\n{indent}}}"))
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"factor": factor},
                            note=f"{function.name}: {len(edits)} grid-stride loop(s), {factor} grids a step")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        factor = _key(anchor)
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        edits = [(outer.start_byte, outer.end_byte, text) for outer, u, text in unrolled_loops(parsed, function)
                 if u == factor]
        if not edits:
            raise NotApplicable(f"{anchor}: no grid-stride loop of {function.name} is unrolled {factor} grids a step")
        source = splice(parsed.data, edits)[0].decode("utf-8")
        rerolled = self.rewrite(state, anchor, Direction.BACKWARD, source, carrier={"factor": factor},
                                note=f"{function.name}: {len(edits)} grid-stride loop(s), one grid a step")
        # legal only where the plain loops unroll back to this kernel: a work that leaves its loop, moves its index
        # or waits at a barrier computes otherwise unrolled, and a kernel with other loops is not this form
        return self.comes_back(state, anchor, rerolled, f"rerolled, {function.name} would not unroll back")

def _key(anchor: Anchor) -> int:
    match = _KEY.match(anchor.key)
    if anchor.kind != "function" or match is None:
        raise NotApplicable(f"reroll_grid_stride needs a function anchor keyed `loops*<U>`, not {anchor}")
    return int(match["factor"])


register(RerollGridStride())
