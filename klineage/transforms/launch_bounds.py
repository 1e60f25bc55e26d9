"""launch_bounds: remove `__launch_bounds__(...)` from one kernel.

Anchor: the kernel, kind "function", key `launch_bounds(<arguments as written>)`; the arguments
(the carrier: max threads per block, min blocks per SM, max cluster size) travel in the key, so
forward restores them from the simplified source and the anchor alone. Where the attribute did not
stand right before the kernel's name, `@<token>` records the token it preceded (`@void` for
`__global__ __launch_bounds__(256) void k(...)`).

Backward is correct when the kernel stays launchable without the bound: with no bound the compiler
may give a thread up to 255 registers, which the 64K-register file holds for blocks of at most
256 threads. So the rewrite applies when the attribute's own max-threads, or every block the plan
launches the kernel with, is at most 256 threads; otherwise (or when the block size depends on the
case) it is NotApplicable, since the kernel might no longer launch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

SAFE_THREADS = 256  # 255 registers (256 allocated) x 256 threads = the 64K-register file of an SM
_KEY = re.compile(r"^launch_bounds\((?P<args>.*)\)(?:@(?P<before>\S+))?$", re.DOTALL)


def _arguments(parsed: cp.ParsedSource, bounds: Node) -> str:
    """The attribute's arguments exactly as written between its parentheses."""
    text = parsed.text(bounds)
    return text[text.index("(") + 1:text.rindex(")")]


def _c_int(text: str, constants: dict) -> int:
    text = re.sub(r"(?<![\w.])(\d+)[uUlL]+\b", r"\1", text.strip())
    text = re.sub(r"(?<!/)/(?!/)", "//", text)
    return expr.evaluate_int(text, constants)


class LaunchBounds(Transform):
    name = "launch_bounds"
    intent = "Bound the kernel's block size (and occupancy target) so the compiler can budget registers."
    removes = ("launch_bounds",)

    def _kernels(self, parsed: cp.ParsedSource) -> list[cp.Function]:
        return [f for f in cp.functions(parsed) if f.is_kernel]

    def _declarator(self, function: cp.Function) -> Node:
        return function.node.child_by_field_name("declarator")

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function in self._kernels(parsed):
            bounds = next((c for c in function.node.children if c.type == "launch_bounds"), None)
            if bounds is None:
                continue
            key = f"launch_bounds({_arguments(parsed, bounds)})"
            following = bounds.next_sibling
            while following is not None and following.type == "comment":
                following = following.next_sibling
            if following is not None and following != self._declarator(function):
                key += f"@{parsed.text(following)}"
            anchors.append(Anchor(function.name, "function", key, parsed.text(bounds)))
        return anchors

    def _function(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[cp.Function, re.Match]:
        match = _KEY.match(anchor.key) if anchor.kind == "function" else None
        if match is None:
            raise NotApplicable(f"launch_bounds needs a function anchor keyed `launch_bounds(...)`, not {anchor}")
        for function in self._kernels(parsed):
            if function.name == anchor.function:
                return function, match
        raise NotApplicable(f"launch_bounds: no __global__ function '{anchor.function}'")

    def _check_launchable(self, state: KernelState, function: cp.Function) -> None:
        constants = state.constants
        if function.launch_bounds:
            try:
                if _c_int(function.launch_bounds[0], constants) <= SAFE_THREADS:
                    return
            except ExpressionError:
                pass
        launches = [launch for launch in state.plan.launches
                    if launch.entry.split("<")[0].strip() == function.name]
        for launch in launches:
            threads = 1
            for dim in launch.block:
                try:
                    threads *= expr.evaluate_int(dim, constants)
                except ExpressionError:
                    raise NotApplicable(
                        f"launch_bounds: {function.name}'s block size `{dim}` depends on the case, and without "
                        f"__launch_bounds__ the compiler may use up to 255 registers per thread, which only "
                        f"blocks of at most {SAFE_THREADS} threads can launch with") from None
            if threads > SAFE_THREADS:
                raise NotApplicable(
                    f"launch_bounds: {function.name} is launched with {threads} threads per block; without "
                    f"__launch_bounds__ the compiler may use up to 255 registers per thread, and then a block of "
                    f"more than {SAFE_THREADS} threads cannot launch")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function, match = self._function(parsed, anchor)
        bounds = next((c for c in function.node.children if c.type == "launch_bounds"), None)
        if bounds is None:
            raise NotApplicable(f"launch_bounds: {function.name} has no __launch_bounds__")
        if _arguments(parsed, bounds) != match["args"]:
            raise NotApplicable(f"launch_bounds: {function.name} has {parsed.text(bounds)}, "
                                f"not __launch_bounds__({match['args']})")
        self._check_launchable(state, function)
        data = parsed.data
        start, end = bounds.start_byte, bounds.end_byte
        after = len(data[end:]) - len(data[end:].lstrip(b" \t"))
        if after and data[end + after:end + after + 1] not in (b"\n", b"\r"):
            end += after  # `void __launch_bounds__(256) k(` -> `void k(`
        else:
            start -= len(data[:start]) - len(data[:start].rstrip(b" \t"))  # `void __launch_bounds__(..)\nk(`
            end += after
        source = (data[:start] + data[end:]).decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            carrier={"launch_bounds": [a.strip() for a in function.launch_bounds]},
                            note=f"removed {parsed.text(bounds)} from {function.name}")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function, match = self._function(parsed, anchor)
        if function.launch_bounds:
            raise NotApplicable(f"launch_bounds: {function.name} already has __launch_bounds__")
        children = [c for c in function.node.children if c.type != "comment"]
        target = self._declarator(function)
        if match["before"]:
            target = next((c for c in children if parsed.text(c) == match["before"]), None)
            if target is None:
                raise NotApplicable(f"launch_bounds: no `{match['before']}` in {function.name}'s declaration")
        previous = target.prev_sibling
        data = parsed.data
        text = f"__launch_bounds__({match['args']})"
        gap = data[previous.end_byte:target.start_byte] if previous is not None else b""
        if previous is not None and b"\n" in gap:
            at, insert = previous.end_byte, f" {text}"  # it ended the line before the name
        else:
            at, insert = target.start_byte, f"{text} "
        source = (data[:at] + insert.encode() + data[at:]).decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            carrier={"launch_bounds": [a.strip() for a in match["args"].split(",")]},
                            note=f"added {text} to {function.name}")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """Kernels without the attribute that the plan launches, every time, with a block size known
        from the source: the bound is that block size (the constant's name when a single launch
        names one, else the number), so the kernel stays launchable.

        The carrier's minimum-blocks argument is never placed here. It is an occupancy target chosen
        for the register use of the kernel the card was walked from; on another kernel it moves the
        compiler's register budget blindly (a minimum of 1 lets it take up to 255 registers: 80 -> 167
        on a warp-per-row log-softmax, halving the blocks an SM holds)."""
        parsed = cp.parse(state.source)
        constants = state.constants
        anchors = []
        for function in self._kernels(parsed):
            launches = [launch for launch in state.plan.launches
                        if launch.entry.split("<")[0].strip() == function.name]
            if function.launch_bounds or not launches:
                continue
            sizes = []
            for launch in launches:
                threads = 1
                for dim in launch.block:
                    try:
                        threads *= expr.evaluate_int(str(dim), constants)
                    except ExpressionError:
                        threads = 0
                sizes.append(threads)
            if not all(sizes) or max(sizes) > 1024:
                continue
            named = [d for d in launches[0].block if str(d) not in ("1", "")]
            bound = str(max(sizes))
            if len(launches) == 1 and len(named) == 1 and str(named[0]) in constants:
                bound = str(named[0])
            anchors.append(Anchor(function.name, "function", f"launch_bounds({bound})",
                                  f"__launch_bounds__({bound})"))
        return anchors


register(LaunchBounds())
