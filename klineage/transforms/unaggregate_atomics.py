"""unaggregate_atomics: a warp's atomic adds summed by shuffles and made once per warp become one atomic add per
thread; forward finds its sites by analysis.

The mechanism (forward): an elementwise kernel that sums into one place with atomics (a loss, a dot product, a
norm, a count: `if (i < n) { ...; atomicAdd(out, v); }`, in either naive form) makes 32 atomics per warp on one
address, each waiting for the last. Forward gives each thread a running total instead: every `atomicAdd(P, v)` of
the element's work becomes `total += v`; after the guard, where every lane of the warp arrives, a butterfly of
`__shfl_xor_sync` sums the warp's totals, and its first lane makes the one atomic add:

    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float warp_total = 0;
    if (i < n) { ...; warp_total += v; }
    for (int offset = 16; offset > 0; offset /= 2) warp_total += __shfl_xor_sync(0xffffffffu, warp_total, offset);
    if (threadIdx.x % 32 == 0) atomicAdd(out, warp_total);

The sum is reassociated: integers sum to the same value, floating point to one of the values the naive kernel's
unordered atomics could already give, rounded differently (the gate's tolerance judges it).

Legality (forward_sites), decided on the parse and the plan: the naive element form `_naive.element_work` reads (a
1-D launch passing no buffer twice, work without loop, barrier, collective or early exit); every launch's block is
a literal multiple of 32 (whole warps: the shuffle needs every lane); the work's only atomic calls are
`atomicAdd(P, v)` statements (their old value unused), one P in all, naming only kernel parameters it never
assigns (`out`, `out + k`, `&out[k]`), so every lane adds to the same place; P's array is not otherwise touched
by the kernel, and its element type is float, double, int, unsigned or unsigned long long.

Backward serializes the form forward writes: each `total += v` of the guarded work becomes `atomicAdd(P, v)` again,
and the total, the butterfly and the warp's atomic go.

Anchor: the kernel, kind "function", key the total's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import call_arguments, indentation, is_written, splice
from klineage.transforms._flatten import flattened
from klineage.transforms._naive import element_work, if_form, kernel, launches_of, parameters, readable, squash
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

TOTAL = "warp_total"
TYPES = frozenset({"float", "double", "int", "unsigned", "unsigned int", "unsigned long long"})
_BUTTERFLY = "for (int offset = 16; offset > 0; offset /= 2) {t} += __shfl_xor_sync(0xffffffffu, {t}, offset);"
_WARP_ADD = "if (threadIdx.x % 32 == 0) atomicAdd({p}, {t});"


@dataclass(frozen=True)
class _Site:
    function: cp.Function
    guard: Node  # `if (i < n) <work>`
    target: str  # P, as written
    element: str  # P's element type
    adds: tuple[Node, ...]  # the `atomicAdd(P, v)` calls
    total: str


class UnaggregateAtomics(Transform):
    name = "unaggregate_atomics"
    intent = ("Sum a warp's atomic adds to one address with register shuffles and let one lane make a single "
              "atomic add per warp.")
    removes = ("shfl",)  # the butterfly: cards of warp shuffles lend it their sites
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", form[0], parsed.text(function.node)[:200])
                for function, form in readable(parsed, lambda f: _aggregated(parsed, f))]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = if_form(flattened(canonical(state)))  # the index and guard as the naive form spells them, 1-D
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", site.total, parsed.text(site.guard)[:200])
                for function, site in readable(parsed, lambda f: _serial(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = if_form(flattened(canonical(state)))
        parsed = cp.parse(state.source)
        site = _serial(state, parsed, kernel(parsed, anchor))
        if site.total != anchor.key:
            raise NotApplicable(f"{anchor}: the total would be '{site.total}'")
        indent = indentation(parsed.data, site.guard.start_byte)
        edits = [(add.parent.start_byte, add.parent.end_byte,
                  f"{site.total} += {parsed.text(call_arguments(add)[1])};") for add in site.adds]
        start = site.guard.start_byte
        guard = splice(parsed.data[start:site.guard.end_byte],
                       [(a - start, b - start, text) for a, b, text in edits])[0].decode("utf-8")
        text = "\n".join([f"{site.element} {site.total} = 0;", indent + guard,
                          indent + _BUTTERFLY.format(t=site.total), indent + _WARP_ADD.format(p=site.target,
                                                                                              t=site.total)])
        source = splice(parsed.data, [(site.guard.start_byte, site.guard.end_byte, text)])[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            note=f"{site.function.name}: a warp's adds to {site.target} summed by shuffles, one "
                                 f"atomicAdd per warp")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        total, declaration, guard, warp_add, target = _aggregated(parsed, function)
        if total != anchor.key:
            raise NotApplicable(f"{anchor}: the total is '{total}'")
        adds = [node for node in cp.nodes_of_type(guard, "expression_statement")
                if re.fullmatch(rf"{total} \+= .+;", squash(parsed.text(node)))]
        edits = [(node.start_byte, node.end_byte,
                  f"atomicAdd({target}, {parsed.text(node.named_children[0].child_by_field_name('right'))});")
                 for node in adds]
        edits += [(declaration.start_byte, guard.start_byte, ""), (guard.end_byte, warp_add.end_byte, "")]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: one atomicAdd to {target} per thread")


def _serial(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> _Site:
    """The naive form's atomics in `function`, or NotApplicable with the reason."""
    work = element_work(state, parsed, function)
    for launch in launches_of(state, function.name, dimensions=1):
        block = str(launch.block[0]).strip()
        if not block.isdigit() or int(block) % 32:
            raise NotApplicable(f"{function.name}'s block of {block} threads is no whole number of warps")
    guard = work.nodes[0].parent
    calls = [call for node in work.nodes for call in cp.nodes_of_type(node, "call_expression")
             if cp.call_name(call).startswith("atomic")]
    adds = [call for call in calls if cp.call_name(call) == "atomicAdd" and call.parent.type == "expression_statement"]
    if not adds or len(adds) != len(calls):
        raise NotApplicable(f"{function.name}'s work makes no atomicAdd, or other atomics, or uses one's old value")
    targets = {squash(parsed.text(call_arguments(call)[0])) for call in adds}
    if len(targets) != 1 or any(len(call_arguments(call)) != 2 for call in adds):
        raise NotApplicable(f"{function.name}'s atomics add to {len(targets)} places, not one")
    target = targets.pop()
    params = {name: (kind, pointer) for name, kind, pointer in parameters(parsed, function)}
    named = set(re.findall(r"[A-Za-z_]\w*", target))
    arrays = [name for name in named if params.get(name, ("", False))[1]]
    if not named <= set(params) or len(arrays) != 1:
        raise NotApplicable(f"{function.name} adds to `{target}`, which names more than its parameters and one array")
    array = arrays[0]
    body = function.node.child_by_field_name("body")
    for use in cp.nodes_of_type(body, "identifier"):
        if parsed.text(use) in named and is_written(use):
            raise NotApplicable(f"{function.name} assigns '{parsed.text(use)}', which its atomics' address names")
        if parsed.text(use) == array and not any(_within(use, call_arguments(call)[0]) for call in adds):
            raise NotApplicable(f"{function.name} touches '{array}' beyond its atomic adds")
    element = params[array][0].removeprefix("const ").strip()
    if element not in TYPES:
        raise NotApplicable(f"'{array}' points to {element}, which no atomicAdd sums")
    taken = {parsed.text(node) for node in cp.nodes_of_type(function.node, "identifier")}
    total = next(name for name in (TOTAL, f"{TOTAL}_", f"{TOTAL}__", f"{TOTAL}_sum") if name not in taken)
    return _Site(function, guard, target, element, tuple(adds), total)


def _within(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def _aggregated(parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, Node, Node, Node, str]:
    """(total, its declaration, the guard, the warp's atomic, P) of the form forward writes."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    listed = [node for node in body.named_children if node.type != "comment"]
    for at in range(len(listed) - 3):
        declaration, guard, butterfly, warp_add = listed[at:at + 4]
        declared = re.fullmatch(rf"((?:{'|'.join(sorted(TYPES))})) ([A-Za-z_]\w*) = 0;",
                                squash(parsed.text(declaration)))
        if declared is None or guard.type != "if_statement":
            continue
        total = declared[2]
        target = re.fullmatch(re.escape(_WARP_ADD.format(p="@", t=total)).replace("@", "(.+)"),
                              squash(parsed.text(warp_add)))
        if squash(parsed.text(butterfly)) == _BUTTERFLY.format(t=total) and target and warp_add == listed[-1]:
            return total, declaration, guard, warp_add, target[1]
    raise NotApplicable(f"{function.name} has no warp-aggregated atomic add")


register(UnaggregateAtomics())
