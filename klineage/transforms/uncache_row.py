"""uncache_row: a row a warp keeps in registers across its passes is read from global memory in every pass.

The mechanism (forward): a warp-per-row kernel (the form `serialize_reduction`'s forward writes: `lane`
strides each row loop `for (int j = lane; j < n; j += 32)`) or a block-per-row one (`serialize_block_reduction`'s
`for (int j = lane; j < n; j += 256)` with `lane` the thread's index, or a hand-written `for (int j = tid; j < n; j
+= blockDim.x)`) whose loops read the same row `a[j]` two or more times (a softmax or a norm: max, sum, store)
keeps the row in a register array of CACHE values per thread when the row fits (n <= S * CACHE for the stride S):
each such loop runs fully unrolled over the array (`j = lane + S * t`, guarded by `j < n`), the first one loading
it, the later ones reading registers only. Slot t holds column `lane + S * t` in every pass, whatever S is, and
covers every column the loop reaches where n <= S * CACHE; a row that does not fit takes the loop as it was (kept
verbatim in the `else` branch), so every n stays correct. CACHE is the carrier value `row_cache`: 64 for a warp's
stride of 32 (2048 columns), and for a block's stride what 16384 registers a block leave each thread, at most 64
(a block of 256 threads: 64; of 1024: 16), so that the block still launches.

Backward drops the array and puts each loop back from its `else` branch.

Legality (forward_sites), conservative: each pass starts at the lane (`lane`, or a local the kernel sets to
`threadIdx.x % 32` or `& 31` and never assigns) and steps by 32, or starts at the thread's index (`threadIdx.x`, or a
local set to it and never assigned) and steps by a number or `blockDim.x`, every pass alike, the launches' blocks
numbers for a block's stride; `a` is a `const float*` (parameter or local) that the kernel never
moves, read in each strided loop only as `a[j]` of that loop's index, or `a[X + j]` with one X in every pass
whose names the kernel never assigns (`x[row * n + j]`: the row is the same in every pass), or through
`__ldg(&...)`, which becomes the register read whole: no other address of the row is taken; the loops sit in
one block (the first, which loads, runs whenever a later one does) and share one bound; their bodies assign
neither their index nor the bound; the kernel names no `row_cache` or `cache_t` of its own; the launch passes
no buffer twice (no store can reach the cached row).

Anchor: the kernel, kind "function", key the cached pointer.

Hand-written kernels spell the mechanism their own way: a per-thread array filled in one pass over its size
and read in later ones (`_register_cache` says which spelling is matched). There the backward makes the
later passes load again and the forward puts the register reads back; anchor: the function holding the
array (a kernel or a device function), kind "array", key the array's name. A card learned from such a
walk places the mechanism on new kernels through the canonical forward above (`forward_sites`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms import _register_cache as rc
from klineage.transforms import _row_vectors as rv
from klineage.transforms import register
from klineage.transforms._edit import (
    Edit,
    indentation,
    ldg_calls,
    operator,
    outer_parens,
    own_lines,
    reindent,
    splice,
    unassigned_locals,
)
from klineage.transforms._naive import LOOP_INDEX_TYPES, kernel, launches_of, squash
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Role, Transform, refused

CACHE, BLOCK_REGISTERS = 64, 16384  # a warp's cache; the registers a block's caches may take together
LANE, WARP = "lane", 32
_STRIDED = re.compile(rf"^for \((?:{LOOP_INDEX_TYPES}) (\w+) = (\w+|threadIdx\.x); \1 < ([\w.]+); "
                      r"\1 \+= (\w+|blockDim\.x)\)")
_CACHE_DECLARATION = re.compile(r"^float row_cache\[(\d+)\];$")
_LANE_VALUES = frozenset({"threadIdx.x % 32", "threadIdx.x & 31"})  # what a lane local holds


@dataclass(frozen=True)
class Pass:
    node: Node
    index: str
    offset: str  # X of the pass's reads `a[X + j]`, "" for `a[j]`


@dataclass(frozen=True)
class Walk:
    """What every pass shares: where a thread starts, its step, the bound, and the values a thread caches."""
    start: str
    stride: str
    bound: str
    cache: int


class UncacheRow(Transform):
    name = "uncache_row"
    intent = ("Keep a row a warp reads in several passes in registers (fully unrolled over a fixed number of "
              "values per lane), falling back to the passes as they were for rows that do not fit.")
    placement = Placement.ANALYSIS
    role = Role.MECHANISM

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        found = []
        for function in cp.functions(parsed):
            body = function.node.child_by_field_name("body")
            if function.is_kernel and body is not None and _cache_declaration(parsed, body) is not None:
                pointer = re.search(r"row_cache\[cache_t\] = (\w+)\[", parsed.text(body))
                if pointer:
                    found.append(Anchor(function.name, "function", pointer[1], parsed.text(function.node)[:200]))
        for function in cp.functions(parsed):
            body = function.node.child_by_field_name("body")
            found += [Anchor(function.name, "array", cache.name, parsed.text(cache.declaration))
                      for cache in (rc.caches(parsed, body) if body is not None else [])]
        return found

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function in cp.functions(parsed):
            body = function.node.child_by_field_name("body")
            if not function.is_kernel or body is None:
                continue
            for pointer in _const_float_pointers(parsed, function):
                try:
                    _passes(state, parsed, function, pointer)
                except NotApplicable as error:
                    refused(function, error)
                    continue
                anchors.append(Anchor(function.name, "function", pointer, parsed.text(function.node)[:200]))
        return anchors

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        if anchor.kind == "array":
            body = _holding(parsed, anchor)
            source = splice(parsed.data, rc.recache_edits(parsed, body, anchor.key))[0].decode("utf-8")
            return self.rewrite(state, anchor, Direction.FORWARD, source,
                                note=f"{anchor.function}: the later passes read {anchor.key} from registers")
        function = kernel(parsed, anchor)
        if anchor.key not in _const_float_pointers(parsed, function):
            raise NotApplicable(f"{anchor}: '{anchor.key}' is no const float pointer of the kernel")
        passes, walk = _passes(state, parsed, function, anchor.key)
        data = parsed.data
        first = passes[0].node
        indent = indentation(data, first.start_byte)
        edits = [Edit(first.start_byte, first.start_byte, f"float row_cache[{walk.cache}];\n{indent}")]
        for number, step in enumerate(passes):
            edits.append(Edit(step.node.start_byte, step.node.end_byte,
                              _cached(parsed, step, anchor.key, walk, indent, load=number == 0)))
        source = splice(data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"row_cache": walk.cache},
                            note=f"{function.name}: {anchor.key}'s row kept in {walk.cache} registers per thread "
                                 f"across {len(passes)} passes when {walk.bound} <= {walk.stride} * {walk.cache}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        if anchor.kind == "array":
            body = _holding(parsed, anchor)
            cache = rc.named(parsed, body, anchor.key)
            source = splice(parsed.data, rc.uncache_edits(parsed, cache))[0].decode("utf-8")
            return self.rewrite(state, anchor, Direction.BACKWARD, source,
                                note=f"{anchor.function}: the later passes load {cache.reload} again instead of "
                                     f"reading {anchor.key} from registers")
        function = kernel(parsed, anchor)
        body = function.node.child_by_field_name("body")
        declaration = _cache_declaration(parsed, body)
        if declaration is None:
            raise NotApplicable(f"{anchor}: no row_cache")
        if re.search(r"\brow_vec4\b", parsed.text(body)):  # its vector branches read the cache too
            raise NotApplicable(f"{anchor}: the cache is filled 16 bytes a lane at a time (row_vec4): "
                                f"scalarize_row_cache takes that apart first")
        span = own_lines(parsed, declaration)
        if span is None:
            raise NotApplicable(f"{anchor}: the row_cache declaration shares its line")
        edits = [Edit(*span)]
        for node in cp.nodes_of_type(body, "if_statement"):
            condition = squash(parsed.text(node.child_by_field_name("condition")))
            alternative = node.child_by_field_name("alternative")
            if not re.fullmatch(r"\([\w.]+ <= (?:\d+|blockDim\.x) \* \d+\)", condition) or alternative is None:
                continue
            kept = [c for c in cp.nodes_of_type(alternative, "for_statement") if c.parent.parent == alternative
                    or c.parent == alternative]
            if len(kept) != 1:
                raise NotApplicable(f"{anchor}: an uncached branch without its loop")
            indent = indentation(parsed.data, node.start_byte)
            text = reindent(parsed.text(kept[0]), len(indent) + 4, indent)[len(indent):]
            edits.append(Edit(node.start_byte, node.end_byte, text))
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: {anchor.key}'s row read from memory in every pass")


def _holding(parsed: cp.ParsedSource, anchor: Anchor) -> Node:
    """The body of the function named by the anchor that declares its array (names may be overloaded)."""
    for function in cp.functions(parsed):
        body = function.node.child_by_field_name("body")
        if function.name == anchor.function and body is not None \
                and any(name == anchor.key for name, _, _ in rc.arrays(parsed, body)):
            return body
    raise NotApplicable(f"{anchor}: no function {anchor.function} declares {anchor.key}")


def _cache_declaration(parsed: cp.ParsedSource, body: Node) -> Node | None:
    """The forward's `float row_cache[N];`, in the body or a block of it (`if (row < rows) { ... }`)."""
    return next((s for s in cp.nodes_of_type(body, "declaration")
                 if _CACHE_DECLARATION.match(squash(parsed.text(s)))), None)


def _const_float_pointers(parsed: cp.ParsedSource, function: cp.Function) -> list[str]:
    text = parsed.text(function.node)
    return list(dict.fromkeys(rv.CONST_FLOAT_POINTER.findall(text)))


def _passes(state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
            pointer: str) -> tuple[list[Pass], Walk]:
    """The strided loops that read `pointer[index]`, in order, and what they share; NotApplicable unless there are
    two or more, every use of the pointer inside them is that read, and each starts and steps alike."""
    launches = launches_of(state, function.name, dimensions=3)  # distinct buffers: no store reaches the cached row
    body = function.node.child_by_field_name("body")
    text = parsed.text(body)
    if re.search(r"\b(?:row_cache|cache_t)\b", text):
        raise NotApplicable("the kernel already names row_cache or cache_t")
    passes, walks = [], set()
    for node in cp.nodes_of_type(body, "for_statement"):
        header = squash(parsed.data[node.start_byte:node.child_by_field_name("body").start_byte].decode())
        match = _STRIDED.match(header)
        loop_text = parsed.text(node.child_by_field_name("body"))
        if match is None or not re.search(rf"\b{pointer}\b", loop_text):
            continue
        index, start, bound, stride = match.groups()
        uses = len(re.findall(rf"\b{pointer}\b", loop_text))
        reads = [s for s in cp.nodes_of_type(node.child_by_field_name("body"), "subscript_expression")
                 if parsed.text(s.child_by_field_name("argument")) == pointer]
        if uses != len(reads):
            raise NotApplicable(f"a pass uses {pointer} other than as {pointer}[{index}] or {pointer}[X + {index}]")
        offsets = {rv.offset_of(squash(parsed.text(s.child_by_field_name("indices"))).strip("[]").strip(), index,
                                pointer) for s in reads}
        if len(offsets) != 1:
            raise NotApplicable(f"a pass reads {pointer} at two offsets: {' and '.join(sorted(offsets))}")
        _reads(parsed, node.child_by_field_name("body"), pointer)
        if re.search(rf"\b(?:{index}|{re.escape(bound)})\s*(?:[-+*/]?=[^=]|\+\+|--)", loop_text):
            raise NotApplicable("a pass assigns its index or bound")
        passes.append(Pass(node, index, offsets.pop()))
        walks.add((start, stride, bound))
    if len(passes) < 2:
        raise NotApplicable(f"{pointer} is read in fewer than two passes")
    if len({step.node.parent.id for step in passes}) != 1:
        raise NotApplicable("the passes are not in one block: the first might not run")
    if len({step.offset for step in passes}) != 1:
        raise NotApplicable(f"the passes read {pointer} at different offsets: not one row")
    fixed = {pointer} | set(re.findall(r"\b[A-Za-z_]\w*\b", passes[0].offset))
    for change in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = change.child_by_field_name("left") or change.child_by_field_name("argument")
        if target is not None and squash(parsed.text(target)).strip("()") in fixed:
            raise NotApplicable(f"the kernel moves {pointer}'s row ({squash(parsed.text(target))}) between passes")
    if len(walks) != 1:
        raise NotApplicable("the passes start, step or stop differently")
    (start, stride, bound), = walks
    return passes, Walk(start, stride, bound, _cache(parsed, function, launches, start, stride))


def _cache(parsed: cp.ParsedSource, function: cp.Function, launches: list, start: str, stride: str) -> int:
    """The values a thread caches for passes from `start` by `stride`: a warp's lane by 32, or the thread's index
    in its block by a block's stride (whose register budget divides among the block's threads); NotApplicable for
    any other start."""
    locals_ = {name: value for name, value in unassigned_locals(parsed, function.node).items()
               if "threadIdx.x" in value}
    if stride == str(WARP) and (start == LANE or locals_.get(start) in _LANE_VALUES):
        return CACHE
    if start != "threadIdx.x" and locals_.get(start) != "threadIdx.x":
        raise NotApplicable(f"the passes start at {start}: not the thread's lane (stepping by {WARP}) nor its index")
    constants = parse_constants(parsed.text(parsed.root))
    if stride != "blockDim.x" and not (stride.isdigit() or stride in constants and stride not in locals_):
        raise NotApplicable(f"the passes step by {stride}: not a number, a constant or blockDim.x")
    try:
        threads = max(math.prod(expr.evaluate_int(str(d), constants) for d in launch.block) for launch in launches)
    except ExpressionError:
        raise NotApplicable(f"{function.name}'s block is not a number: no register budget a thread") from None
    return max(1, min(CACHE, BLOCK_REGISTERS // threads))


def _reads(parsed: cp.ParsedSource, scope: Node, pointer: str) -> list[Node]:
    """Each expression of the scope that reads `pointer[k]`: the subscript, or the whole `__ldg(&pointer[k])`
    around it (of a register, `__ldg` would be a global load of a local address, which the GPU faults on).
    NotApplicable where the row's address is taken otherwise."""
    through_ldg = {call.subscript.id: call.node for call in ldg_calls(parsed, scope)}
    found = []
    for node in cp.nodes_of_type(scope, "subscript_expression"):
        if parsed.text(node.child_by_field_name("argument")) != pointer:
            continue
        around = outer_parens(node).parent
        if node.id not in through_ldg and around is not None and around.type == "pointer_expression" \
                and operator(around) == "&":
            raise NotApplicable(f"a pass takes the address of {parsed.text(node)} other than to __ldg it")
        found.append(through_ldg.get(node.id, node))
    return found


def _cached(parsed: cp.ParsedSource, step: Pass, pointer: str, walk: Walk, indent: str, *, load: bool) -> str:
    """The pass as a fully unrolled walk over the register array when the row fits, else as it was."""
    body = step.node.child_by_field_name("body")
    text, base = parsed.text(body), body.start_byte
    for node in sorted(_reads(parsed, body, pointer), key=lambda n: -n.start_byte):
        text = text[:node.start_byte - base] + "row_cache[cache_t]" + text[node.end_byte - base:]
    inner = indent + " " * 12
    column = len(indentation(parsed.data, body.start_byte))
    rebodied = inner + reindent(text, column, inner)[len(inner):]
    lines = [f"if ({walk.bound} <= {walk.stride} * {walk.cache}) {{",
             "    #pragma unroll",
             f"    for (int cache_t = 0; cache_t < {walk.cache}; ++cache_t) {{",
             f"        const int {step.index} = {walk.start} + {walk.stride} * cache_t;",
             f"        if ({step.index} < {walk.bound}) {{"]
    head = "\n".join(indent + line for line in lines)[len(indent):]
    at = f"{step.offset} + {step.index}" if step.offset else step.index
    loaded = f"{inner}row_cache[cache_t] = {pointer}[{at}];\n" if load else ""
    original = reindent(parsed.text(step.node), len(indent), indent + "    ")
    return (f"{head}\n{loaded}{rebodied}\n{indent}        }}\n{indent}    }}\n{indent}}} else {{\n{original}\n"
            f"{indent}}}")


register(UncacheRow())
