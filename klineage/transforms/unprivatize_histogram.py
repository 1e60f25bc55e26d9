"""unprivatize_histogram: a block's shared-memory copy of a histogram's bins, flushed once per block to the global
bins, becomes one global atomic add per element; forward finds its sites by analysis.

The mechanism (forward): a histogram kernel adds each element's weight to its bin with `atomicAdd(&hist[b], v)`.
Where many elements fall in few bins, those atomics queue on the same global addresses. Privatized, each block
counts into its own copy of the bins in shared memory (shared atomics, resolved in the SM), and adds each non-zero
bin of the copy to the global histogram once:

    int i = blockIdx.x * blockDim.x + threadIdx.x;
    __shared__ int s_hist[256];
    for (int k = threadIdx.x; k < 256; k += blockDim.x) s_hist[k] = 0;
    __syncthreads();
    if (i < n) { ...; atomicAdd(&s_hist[b], v); }
    __syncthreads();
    for (int k = threadIdx.x; k < 256; k += blockDim.x) {
        if (s_hist[k] != 0) atomicAdd(&hist[k], s_hist[k]);
    }

The naive form it reads: a 1-D element kernel as `_naive.element_work` reads it (`if (i < n) <work>`, or `if (i >= n)
return;` and the work after it, which `if_form` turns into the `if`, so that every thread reaches both barriers),
whose work adds to one array parameter `hist` only by `atomicAdd(&hist[E], v)` or `atomicAdd(hist + E, v)`
statements. The bins keep their element type (int, unsigned, unsigned long long, float or double).

The bin count, and the copy. Every index E must be shown to lie in [0, C) for one count C the kernel states:
- a guard around the atomic: `if (b >= 0 && b < C)` (either side of each compare, `b <= K` for C = K + 1, the
  conjuncts of `&&` in any enclosing `if`), where b names nothing the `if` assigns and reads only arrays the kernel
  never writes;
- a clamp: `min(max(X, 0), C - 1)` (either argument order, or `max(min(X, C - 1), 0)`), a mask `X & M` (C = M + 1),
  a remainder `X % C` of a non-negative X, or a value of an 8- or 16-bit unsigned type (a `const unsigned char*`
  input: C = 256);
- through a local: `int b = ...;` and plain `b = ...;` statements, the value the atomic sees being the last one
  before it, where every such statement before it is in a block that holds the atomic (no conditional assignment).
An unsigned local or read is non-negative by its type. C is a number (a literal or a `constexpr` / `#define`
constant) or a scalar integer parameter the kernel never assigns (`nbins`):
- a number: a static `__shared__ T s_hist[C];`, refused where C bins take more than 16 KiB (4096 four-byte or 2048
  eight-byte bins). Why 16 KiB: an SM holds at most 2048 threads, 8 blocks of 256, and 8 copies of 16 KiB (128 KiB)
  fit the shared memory of an A100 (164 KiB) or an H100 (228 KiB) SM, so the copy does not lower the occupancy of
  blocks of 256 threads or more; it stays under the 48 KiB a block gets without opting in; and the zeroing and
  flushing loops stay short beside the block's elements (16 steps a thread at 4096 bins and 256 threads).
- a parameter: the launch plan sizes dynamic shared memory (`shared`), so the copy is `extern __shared__ T
  s_hist[];` sized per launch from what the plan passes for the parameter, `size * (V if 0 < V <= CAP else 0)`.
  Its value is known only at run time, so the privatized work runs under `if (nbins > 0 && nbins <= CAP)` (a
  kernel parameter: the same in every thread, so every thread of a block reaches both barriers or neither), CAP the
  same 16 KiB bound in bins, and the naive work as it was runs after `else`: more bins than the copy holds (or no
  bins) take the global atomics. `nbins - 1` and `X % nbins` are in range only for nbins >= 1, which that branch
  checks; a number must bound the index by itself.

Integer bins give the naive kernel's bits (two's complement adds wrap the same in any order and grouping). Float
bins are reassociated: a bin's adds are summed per block first, in another order than the naive kernel's unordered
atomics, and a block's bins whose adds cancel to zero are skipped; the result is one the gate's tolerance judges.
The flush adds only the bins a block added to, so it touches no global element the naive kernel did not.

Legality (forward_sites), decided on the parse and the plan; anything unproven is no site, with the reason:
- the work is `element_work`'s: no loop, barrier, shared memory, collective, `return` or thread coordinate, the
  guard the kernel's last statement; a 1-D launch passing no buffer twice and asking no dynamic shared memory;
- every atomic of the work is an `atomicAdd` statement (its old value unused) into `hist`, which the kernel
  touches nowhere else and does not declare again; the work calls nothing with an effect but those atomics;
- every index is bounded as above by one count (all by one parameter, or all by numbers: the copy takes the
  largest), and not every index is a constant (adds at fixed places are a sum: `unaggregate_atomics`' site).
Refused, each with its reason: a second read or write of `hist`, an index with no stated bound or one that may be
negative (`x[i] % 256` of a signed x), a return or loop in the work, an atomic whose value is used, another atomic,
a 2-D launch, more bins than the copy holds, a count the kernel assigns, an index reassigned under a condition.

The grid-stride form, where privatizing pays most (each block counts many elements into one copy): a kernel that is
one grid-stride loop over its elements, as `_flatten` reads it (`for (int i = <global index>; i < n; i +=
blockDim.x * gridDim.x) <work>`, the stride maybe a local declared first, or the `while` spelling with the index
declared before the loop and the step the body's last statement; `uncoarsen_grid_stride`'s forward writes the first,
so the two compose). The copy's declaration, zeroing loop and first barrier go right before the loop, the loop's
atomics add to the copy, and the second barrier and the flush go right after it (the dynamic form puts all of them,
the loop included, under the `if`, and the loop as it was after `else`):

    __shared__ int s_hist[256];
    for (int k = threadIdx.x; k < 256; k += blockDim.x) s_hist[k] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        ...; atomicAdd(&s_hist[b], v);
    }
    __syncthreads();
    <the flushing loop>

Every thread of a block reaches both barriers: the loop is the kernel's last statement (nothing after it, so no code
that could read the bins before the flush or wait on another block), and its work has no `return`, `break`,
`continue`, `goto`, barrier, collective, shared memory, inner loop or thread coordinate and never changes the index
(`_flatten`'s reader refuses each, with the reason), so each thread leaves the loop only through its condition. The
loop starts at the global thread index and steps by the grid's width (a loop stepping by the block's width or twice
the grid's is refused): the elements it visits are the naive element kernel's, each once. The work's atomics and
indexes are read by the same rules as the element form's work; the locals an index reads are declared in the loop's
body (the reader allows nothing but the stride and the index before the loop), so each iteration sees only its own
assignments, which the rule for locals reads.

Not read: a 2-D launch.

Backward takes the form forward writes apart: the copy, its zeroing and flushing loops and the barriers go, the
atomics add to `hist` again (the dynamic form keeps the naive work after `else`, which backward keeps, and the
plan's dynamic shared memory goes back to 0).

Anchor: the kernel, key the copy's name, kind "function" for the element form and "loop" for the grid-stride form
(`find` and `forward_sites` tell the two apart; each direction refuses the other form's anchor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.launch import ArgKind, Launch, LaunchPlan
from klineage.transforms import register
from klineage.transforms._calls import MATH_CALLS, first_effect
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import (
    call_arguments,
    contains,
    declared_names,
    indentation,
    is_written,
    operator,
    reindent,
    splice,
    unparen,
)
from klineage.transforms._flatten import _destrided
from klineage.transforms._naive import (
    element_work,
    if_form,
    kernel,
    launches_of,
    parameters,
    readable,
    squash,
    statements,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform, with_plan

# the bins' element types atomicAdd adds in shared memory as in global memory -> bytes
TYPES = {"int": 4, "unsigned": 4, "unsigned int": 4, "uint32_t": 4, "float": 4, "double": 8, "unsigned long long": 8,
         "unsigned long long int": 8}
COPY_BYTES = 16 * 1024  # a block's copy at most (the module docstring says why)
# a count parameter's types: `b < nbins` compares as the index's integers, and a plan passes it as an integer
_COUNT_TYPES = frozenset({"int", "unsigned", "unsigned int", "int32_t", "uint32_t"})
_INTEGER_ARGS = frozenset({"i32", "u32", "i64", "u64"})
# types whose every value is non-negative, and the 8- and 16-bit ones whose every value is a bin of 256 or 65536
_UNSIGNED = frozenset({"unsigned", "unsigned int", "uint32_t", "unsigned char", "uint8_t", "unsigned short",
                       "unsigned short int", "uint16_t", "size_t", "unsigned long", "unsigned long long",
                       "unsigned long long int", "uint64_t"})
_SMALL = {"unsigned char": 256, "uint8_t": 256, "unsigned short": 65536, "unsigned short int": 65536,
          "uint16_t": 65536}
# locals that hold any bin index unchanged (the value assigned is the value read back)
_WIDE = frozenset({"int", "int32_t", "long", "long long", "int64_t", "ptrdiff_t"}) | (_UNSIGNED - set(_SMALL))
_DEPTH = 8  # how many locals deep an index is followed


# the anchor's kind for each form the forward reads: the element form's work is the kernel's, the grid-stride form's
# is its loop's
KINDS = {"element": "function", "grid_stride": "loop"}
_WORK = frozenset({"if_statement", "for_statement", "while_statement"})  # the statement that holds the counting


@dataclass(frozen=True)
class _Count:
    """A bin count: a number (`value`, spelled `text`: a literal or a constant's name) or a scalar parameter
    (`value` None, `text` its name)."""

    value: int | None
    text: str


@dataclass(frozen=True)
class _Site:
    function: cp.Function
    guard: Node  # `if (i < n) <work>` or the grid-stride loop over the elements, the kernel's last statement
    form: str  # "element" or "grid_stride" (KINDS)
    hist: str
    element: str
    bases: tuple[Node, ...]  # `hist` in each atomic's address
    count: _Count
    copy: str  # the shared copy's name
    loop: str  # the zeroing and flushing loops' index


@dataclass(frozen=True)
class _Private:
    """The form forward writes: bytes [start, end) from the copy's declaration to the end of the flushing loop."""

    copy: str
    hist: str
    element: str
    count: str
    start: int
    end: int
    guard: Node  # the work adding to the copy: its `if (i < n)`, or its grid-stride loop
    naive: Node | None  # the dynamic form's `else` branch: the work as it was
    cap: int  # the dynamic form's largest count (0 in the static form)

    @property
    def form(self) -> str:
        return "element" if self.guard.type == "if_statement" else "grid_stride"


class UnprivatizeHistogram(Transform):
    name = "unprivatize_histogram"
    intent = ("Privatize a histogram per block: count into a shared-memory copy of the bins with shared atomics, "
              "then add each non-zero bin to the global histogram once per block.")
    removes = ("shared_array", "dynamic_shared")  # the static copy or the dynamic one, whichever the form has
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, KINDS[form.form], form.copy, parsed.text(form.guard)[:200])
                for function, form in readable(parsed, lambda f: _privatized(parsed, f))]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = if_form(canonical(state))  # the index as the naive form spells it, the guard as an `if`
        parsed = cp.parse(state.source)
        return [Anchor(function.name, KINDS[site.form], site.copy, parsed.text(site.guard)[:200])
                for function, site in readable(parsed, lambda f: _site(state, parsed, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = if_form(canonical(state))
        parsed = cp.parse(state.source)
        site = _site(state, parsed, kernel(parsed, anchor))
        if site.copy != anchor.key or KINDS[site.form] != anchor.kind:
            raise NotApplicable(f"{anchor}: the copy would be '{site.copy}', its work the {KINDS[site.form]}'s")
        guard, indent = site.guard, indentation(parsed.data, site.guard.start_byte)
        start = guard.start_byte
        renames = [(base.start_byte - start, base.end_byte - start, site.copy) for base in site.bases]
        counted = splice(parsed.data[start:guard.end_byte], renames)[0].decode("utf-8")
        size, loops = TYPES[site.element], _Loops(site.copy, site.hist, site.count.text, site.loop)
        if site.count.value is not None:  # a static copy around the work as it stands
            edits = [(start, start, f"__shared__ {site.element} {site.copy}[{site.count.text}];\n{indent}"
                                    f"{loops.zero}\n{indent}__syncthreads();\n{indent}"),
                     *[(base.start_byte, base.end_byte, site.copy) for base in site.bases],
                     (guard.end_byte, guard.end_byte, f"\n{indent}__syncthreads();\n{indent}{loops.flush(indent)}")]
            plan, added = state.plan, "shared_array"
        else:  # a dynamic copy where the bins fit, the work as it was after `else`
            inner = indent + "    "
            private = _shifted(counted, indent, len(indent), inner)
            if _shifted(private, inner, len(inner), indent) != counted:
                raise NotApplicable(f"{site.function.name}'s work has lines left of its guard: it cannot move "
                                    f"into a branch and back unchanged")
            cap = COPY_BYTES // size
            text = (f"extern __shared__ {site.element} {site.copy}[];\n{indent}if ({site.count.text} > 0 && "
                    f"{site.count.text} <= {cap}) {{\n{inner}{loops.zero}\n{inner}__syncthreads();\n{inner}{private}\n"
                    f"{inner}__syncthreads();\n{inner}{loops.flush(inner)}\n{indent}}} else {parsed.text(guard)}")
            edits = [(start, guard.end_byte, text)]
            plan = _sized(state, parsed, site.function, site.count.text, lambda value: _bytes(value, size, cap))
            added = "dynamic_shared"
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self._result(state, anchor, Direction.FORWARD, source, plan, added,
                            f"{site.function.name}: {site.hist} counted per block in a shared copy of "
                            f"{site.count.text} bins, flushed once per block")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        form = _privatized(parsed, function)
        if form.copy != anchor.key or KINDS[form.form] != anchor.kind:
            raise NotApplicable(f"{anchor}: the copy is '{form.copy}', its work the {KINDS[form.form]}'s")
        if form.naive is None:
            edits = [(form.start, form.guard.start_byte, ""), *_renames(parsed, form.guard, form.copy, form.hist),
                     (form.guard.end_byte, form.end, "")]
            plan, removed = state.plan, "shared_array"
        else:
            edits = [(form.start, form.end, parsed.text(form.naive))]
            size, asked = TYPES[form.element], iter(launch.shared for launch in state.plan.launches
                                                    if launch.entry == function.name)

            def unsized(value: str) -> int:
                """0 bytes again, once the launch asks for exactly the copy forward sized."""
                shared = str(next(asked)).strip()
                if shared != _bytes(value, size, form.cap):
                    raise NotApplicable(f"{function.name}'s launch asks for {shared} bytes of shared memory, not "
                                        f"the copy's")
                return 0

            plan, removed = _sized(state, parsed, function, form.count, unsized), "dynamic_shared"
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self._result(state, anchor, Direction.BACKWARD, source, plan, removed,
                            f"{function.name}: one global atomicAdd to {form.hist} per element")

    def _result(self, state: KernelState, anchor: Anchor, direction: Direction, source: str, plan,
                feature: str, note: str) -> Rewrite:
        """The rewrite, declaring the one copy feature it removes (backward) or adds (forward)."""
        new_state = KernelState(source=source, plan=plan)
        if new_state.fingerprint == state.fingerprint:
            raise NotApplicable(f"{self.name} changed nothing at {anchor}")
        backward = direction is Direction.BACKWARD
        return Rewrite(self.name, direction, anchor, new_state, removes=(feature,) if backward else (),
                       adds=() if backward else (feature,), note=note)


@dataclass(frozen=True)
class _Loops:
    """The block-stride loops over the copy that forward writes and backward reads."""

    copy: str
    hist: str
    count: str
    k: str

    @property
    def head(self) -> str:
        return f"for (int {self.k} = threadIdx.x; {self.k} < {self.count}; {self.k} += blockDim.x)"

    @property
    def zero(self) -> str:
        return f"{self.head} {self.copy}[{self.k}] = 0;"

    def flush(self, indent: str) -> str:
        k, copy = self.k, self.copy
        return (f"{self.head} {{\n{indent}    if ({copy}[{k}] != 0) atomicAdd(&{self.hist}[{k}], {copy}[{k}]);\n"
                f"{indent}}}")


def _shifted(text: str, first: str, old: int, new: str) -> str:
    """`text` (its first line starting at a statement indented by `first`, so written without it) moved from
    indentation column `old` to `new`, again without the first line's indentation."""
    return reindent(first + text, old, new)[len(new):]


def _bytes(value: str, size: int, cap: int) -> str:
    """The plan's dynamic shared memory for a copy of `value` bins (what the launch passes for the count): none where
    the kernel takes the naive branch."""
    value = value if re.fullmatch(r"[A-Za-z_]\w*|\d+", value) else f"int({value})"
    return f"{size} * ({value} if 0 < {value} <= {cap} else 0)"


def _sized(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, count: str, shared) -> LaunchPlan:
    """The plan with every launch of `function` asking `shared(V)` bytes of dynamic shared memory, V what the
    launch passes for the count parameter (as an integer)."""
    names = [(name, pointer) for name, _, pointer in parameters(parsed, function)]
    launches = []
    for launch in state.plan.launches:
        if launch.entry == function.name:
            if len(launch.args) != len(names):
                raise NotApplicable(f"{function.name}'s launch passes {len(launch.args)} arguments")
            arg = next((a for (name, _), a in zip(names, launch.args, strict=True) if name == count), None)
            if arg is None or arg.kind is not ArgKind.SCALAR or arg.type not in _INTEGER_ARGS:
                raise NotApplicable(f"{function.name}'s launch passes no integer for its bin count '{count}'")
            launch = Launch(launch.entry, launch.grid, launch.block, shared(str(arg.value).strip()), launch.args)
        launches.append(launch)
    return with_plan(state, launches=tuple(launches))


def _renames(parsed: cp.ParsedSource, guard: Node, old: str, new: str) -> list[tuple[int, int, str]]:
    """`old` -> `new` at each base of an atomic's address in `guard`."""
    return [(base.start_byte, base.end_byte, new) for base in cp.nodes_of_type(guard, "identifier")
            if parsed.text(base) == old]


def _address(parsed: cp.ParsedSource, call: Node, arrays: set[str]) -> tuple[Node, Node] | None:
    """(the array, the index) of an atomic's address `&a[E]` or `a + E` (E + a), `a` one of `arrays`."""
    arguments = call_arguments(call)
    if len(arguments) != 2:
        return None
    address = unparen(arguments[0])
    if address.type == "pointer_expression" and operator(address) == "&":
        element = unparen(address.child_by_field_name("argument"))
        base = element.child_by_field_name("argument") if element.type == "subscript_expression" else None
        if base is not None and base.type == "identifier" and parsed.text(base) in arrays:
            indices = element.child_by_field_name("indices")
            listed = [node for node in indices.named_children if node.type != "comment"] if indices else []
            return (base, listed[0]) if len(listed) == 1 else None
    if address.type == "binary_expression" and operator(address) == "+":
        left, right = address.child_by_field_name("left"), address.child_by_field_name("right")
        for base, index in ((left, right), (right, left)):
            if base.type == "identifier" and parsed.text(base) in arrays:
                return base, index
    return None


def _work(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> tuple[Node, str]:
    """(the statement holding the counting, its form): the element form's `if (i < n)`, or the grid-stride loop
    over the elements of a kernel that names the grid (as `_flatten` tells the two apart), read by `_flatten`'s
    reader: the loop starts at the global thread index, steps by the grid's width (`blockDim.x * gridDim.x`, or a
    stride local declared so), is the kernel's last statement (nothing after it), and its work has no loop,
    barrier, shared memory, collective, jump (`return`, `break`, `continue`, `goto`) or thread coordinate, nor
    changes the index. So every thread leaves the loop only through its condition and reaches the barriers after
    it, and the copy's barriers sit outside the loop."""
    body = function.node.child_by_field_name("body")
    if function.is_kernel and body is not None and "gridDim" in parsed.text(body):
        _destrided(state, parsed, function)  # what it would write is not needed: that it reads the loop, or why not
        return statements(body)[-1], "grid_stride"
    work = element_work(state, parsed, function)
    if work.nodes[0].parent != work.guard:
        raise NotApplicable(f"{function.name}'s guard is not an `if` around its work")
    return work.guard, "element"


def _site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> _Site:
    """The naive histogram in `function`, or NotApplicable with the reason."""
    guard, form = _work(state, parsed, function)
    for launch in launches_of(state, function.name, dimensions=1):
        if str(launch.shared).strip() != "0":
            raise NotApplicable(f"{function.name}'s launch asks for dynamic shared memory already")
    body = function.node.child_by_field_name("body")
    calls = [call for call in cp.nodes_of_type(guard, "call_expression") if cp.call_name(call).startswith("atomic")]
    if not calls:
        raise NotApplicable(f"{function.name}'s work makes no atomicAdd")
    if any(cp.call_name(call) != "atomicAdd" for call in calls):
        raise NotApplicable(f"{function.name}'s work makes other atomics than atomicAdd")
    if any(call.parent.type != "expression_statement" for call in calls):
        raise NotApplicable(f"{function.name} uses an atomic's old value")
    reader = _Reader.of(parsed, function)
    addresses = [_address(parsed, call, set(reader.arrays)) for call in calls]
    if any(address is None for address in addresses):
        raise NotApplicable(f"{function.name}'s atomics do not all add at `&a[E]` or `a + E` of an array parameter")
    arrays = {parsed.text(base) for base, _ in addresses}
    if len(arrays) != 1:
        raise NotApplicable(f"{function.name}'s atomics add to {len(arrays)} arrays, not one histogram")
    hist = arrays.pop()
    bases = tuple(base for base, _ in addresses)
    if hist in declared_names(parsed, body):
        raise NotApplicable(f"{function.name} declares another '{hist}'")
    for use in cp.nodes_of_type(body, "identifier"):
        if parsed.text(use) == hist and use not in bases:
            raise NotApplicable(f"{function.name} touches '{hist}' beyond its atomic adds")
    element = reader.arrays[hist]
    if element not in TYPES:
        raise NotApplicable(f"'{hist}' holds {element}, which no shared-memory atomicAdd adds")
    if (effect := first_effect(parsed, guard, MATH_CALLS | {"atomicAdd"})) is not None:
        raise NotApplicable(f"{function.name}'s work calls {effect}, which may have effects")
    indexes = [index for _, index in addresses]
    if all(reader.constant(index) for index in indexes):
        raise NotApplicable(f"{function.name} adds to '{hist}' only at fixed places: a sum, not a histogram")
    count = _count(reader, function, hist, indexes, calls)
    if count.value is not None and count.value * TYPES[element] > COPY_BYTES:
        raise NotApplicable(f"{count.value} bins of {element} take more than the {COPY_BYTES // 1024} KiB of shared "
                            f"memory a block's copy may")
    if count.value is None:  # the plan must say how many bins each launch has, to size the copy
        _sized(state, parsed, function, count.text, lambda value: 0)
    taken = {parsed.text(node) for node in cp.nodes_of_type(parsed.root, "identifier", "type_identifier")}
    copy = next(name for name in (f"s_{hist}", f"s_{hist}_", f"{hist}_shared", f"{hist}_shared_") if name not in taken)
    loop = next(name for name in ("k", "bin", "bin_", "bin__") if name not in taken)
    return _Site(function, guard, form, hist, element, bases, count, copy, loop)


def _count(reader: _Reader, function: cp.Function, hist: str, indexes: list[Node], calls: list[Node]) -> _Count:
    """The one count that bounds every index, or NotApplicable naming the index that has none."""
    counts = []
    for index, call in zip(indexes, calls, strict=True):
        shown = squash(reader.parsed.text(index))
        bound = reader.upper(index, call)
        if bound is None:
            raise NotApplicable(f"{function.name}'s bin index `{shown}` is not bounded by a bin count it states")
        if not reader.nonnegative(index, call):
            raise NotApplicable(f"{function.name}'s bin index `{shown}` may be negative")
        counts.append(bound)
    parameters_named = {count.text for count in counts if count.value is None}
    numbers = [count for count in counts if count.value is not None]
    if parameters_named and numbers or len(parameters_named) > 1:
        raise NotApplicable(f"{function.name}'s bin indexes are bounded by different counts "
                            f"({', '.join(sorted({count.text for count in counts}))})")
    count = max(numbers, key=lambda c: c.value) if numbers else _Count(None, parameters_named.pop())
    if reader.assumed - ({count.text} if count.value is None else set()):
        raise NotApplicable(f"{function.name}'s bin index is in range only where "
                            f"'{sorted(reader.assumed)[0]}' >= 1, which the copy's branch does not check")
    if count.value is not None and count.value < 1:
        raise NotApplicable(f"{function.name} states no bins for '{hist}'")
    return count


@dataclass
class _Reader:
    """What the kernel says about the values of its bin indexes (the module docstring's rules)."""

    parsed: cp.ParsedSource
    body: Node
    scalars: dict[str, str]  # scalar parameter -> type
    arrays: dict[str, str]  # pointer parameter -> element type, `const` dropped
    constants: dict[str, int]
    changed: set[str]  # names the kernel assigns, increments or takes the address of
    declared: list[str]
    clamps: frozenset[str]  # `min` and `max`, unless the source defines its own (a function or a macro)
    assumed: set[str] = field(default_factory=set)  # count parameters a bound holds for only where they are >= 1

    @classmethod
    def of(cls, parsed: cp.ParsedSource, function: cp.Function) -> _Reader:
        body = function.node.child_by_field_name("body")
        params = parameters(parsed, function)
        changed = {parsed.text(node) for node in cp.nodes_of_type(body, "identifier") if is_written(node)}
        for taken in cp.nodes_of_type(body, "pointer_expression"):
            if operator(taken) == "&" and unparen(taken.child_by_field_name("argument")).type == "identifier":
                changed.add(parsed.text(unparen(taken.child_by_field_name("argument"))))
        named = {name for name, _, _ in params}  # a parameter hides a constant of its name
        constants = {name: value for name, value in parse_constants(parsed.source).items()
                     if isinstance(value, int) and not isinstance(value, bool) and name not in named}
        defined = {f.name for f in cp.functions(parsed)} | {m.name for m in cp.macros(parsed)}
        return cls(parsed, body, {name: kind.removeprefix("const ").strip() for name, kind, pointer in params
                                  if not pointer},
                   {name: kind.removeprefix("const ").strip() for name, kind, pointer in params if pointer},
                   constants, changed, declared_names(parsed, body), frozenset({"min", "max"} - defined))

    def text(self, node: Node) -> str:
        return squash(self.parsed.text(node))

    def number(self, node: Node) -> int | None:
        """The value of an integer literal or a constant; None for anything else."""
        node = unparen(node)
        if node.type == "identifier":
            return self.constants.get(self.parsed.text(node)) if self.parsed.text(node) not in self.declared else None
        if node.type != "number_literal":
            return None
        text = self.parsed.text(node).rstrip("uUlL")
        if re.fullmatch(r"\d+", text):
            return int(text)
        return int(text, 16) if re.fullmatch(r"0[xX][0-9a-fA-F]+", text) else None

    def constant(self, node: Node) -> bool:
        return self.number(node) is not None

    def count(self, node: Node) -> _Count | None:
        """`node` as a bin count: a number, or a scalar integer parameter the kernel never assigns."""
        node = unparen(node)
        if (value := self.number(node)) is not None:
            return _Count(value, self.parsed.text(node))
        name = self.parsed.text(node)
        if node.type == "identifier" and self.scalars.get(name) in _COUNT_TYPES and name not in self.changed and \
                name not in self.declared:  # a local of the same name would hide the parameter
            return _Count(None, name)
        return None

    def last(self, node: Node) -> _Count | None:
        """The count that `node`, as the largest bin (`b <= K`, `min(.., C - 1)`), states: K + 1, or C."""
        node = unparen(node)
        if (value := self.number(node)) is not None:
            return _Count(value + 1, str(value + 1))
        if node.type == "binary_expression" and operator(node) == "-" and \
                self.number(node.child_by_field_name("right")) == 1:
            return self.count(node.child_by_field_name("left"))
        return None

    def upper(self, node: Node, at: Node, depth: int = 0) -> _Count | None:
        """A count C with `node` < C where `at` reads it, or None."""
        node = unparen(node)
        if depth > _DEPTH:
            return None
        if (fact := self._fact(node, at, upper=True)) is not None:
            return fact
        kind = node.type
        if kind == "number_literal":
            return self.last(node)
        if kind == "binary_expression":
            left, right, op = node.child_by_field_name("left"), node.child_by_field_name("right"), operator(node)
            if op == "-":
                return self.last(node)  # `C - 1` is below C
            if op == "&":
                masks = [self.number(side) for side in (left, right) if self.number(side) is not None]
                return _Count(masks[0] + 1, str(masks[0] + 1)) if masks and masks[0] >= 0 else None
            if op == "%":
                bound = self.count(right)
                return bound if bound is not None and (bound.value is None or bound.value >= 1) else None
            return None
        if kind == "call_expression" and cp.call_name(node) in self.clamps:
            arguments = call_arguments(node)
            if len(arguments) != 2:
                return None
            bounds = [self.upper(argument, at, depth + 1) for argument in arguments]
            if cp.call_name(node) == "min":  # below either bound
                numbers = [b for b in bounds if b is not None and b.value is not None]
                return min(numbers, key=lambda b: b.value) if numbers else next((b for b in bounds if b), None)
            return self._larger(*bounds)  # max: below both
        if kind == "cast_expression":
            target = self.text(node.child_by_field_name("type"))
            if target in _SMALL:
                return _Count(_SMALL[target], str(_SMALL[target]))
            return self.upper(node.child_by_field_name("value"), at, depth + 1) if target in _WIDE else None
        if kind == "subscript_expression":
            array = node.child_by_field_name("argument")
            size = _SMALL.get(self.arrays.get(self.parsed.text(array), "")) if array.type == "identifier" else None
            return _Count(size, str(size)) if size else None
        if kind == "identifier":
            size = _SMALL.get(self._type(node))
            if size:
                return _Count(size, str(size))
            value, where = self._definition(node, at)
            return self.upper(value, where, depth + 1) if value is not None else None
        return None

    def nonnegative(self, node: Node, at: Node, depth: int = 0) -> bool:
        """Whether `node` is >= 0 where `at` reads it."""
        node = unparen(node)
        if depth > _DEPTH:
            return False
        if self._fact(node, at, upper=False):
            return True
        kind = node.type
        if kind == "number_literal":
            return self.number(node) is not None
        if kind == "binary_expression":
            left, right, op = node.child_by_field_name("left"), node.child_by_field_name("right"), operator(node)
            if op == "-":
                bound = self.last(node)  # `C - 1`: C >= 1 for a number; a parameter's branch checks it
                if bound is not None and bound.value is None:
                    self.assumed.add(bound.text)
                return bound is not None and (bound.value is None or bound.value >= 1)
            if op == "&":
                return any((mask := self.number(side)) is not None and mask >= 0 for side in (left, right))
            if op == "%":
                bound = self.count(right)
                if bound is not None and bound.value is None:
                    self.assumed.add(bound.text)
                return bound is not None and (bound.value is None or bound.value >= 1) and \
                    self.nonnegative(left, at, depth + 1)
            return False
        if kind == "call_expression" and cp.call_name(node) in self.clamps:
            arguments = call_arguments(node)
            if len(arguments) != 2:
                return False
            signs = [self.nonnegative(argument, at, depth + 1) for argument in arguments]
            return all(signs) if cp.call_name(node) == "min" else any(signs)
        if kind == "cast_expression":
            target = self.text(node.child_by_field_name("type"))
            value = node.child_by_field_name("value")
            # a signed cast of a large unsigned value wraps negative: kept only where the value is a bin already
            return target in _UNSIGNED or (target in _WIDE and self.nonnegative(value, at, depth + 1) and
                                           self.upper(value, at, depth + 1) is not None)
        if kind == "subscript_expression":
            array = node.child_by_field_name("argument")
            return array.type == "identifier" and self.arrays.get(self.parsed.text(array)) in _UNSIGNED
        if kind == "identifier":
            if self._type(node) in _UNSIGNED:
                return True
            value, where = self._definition(node, at)
            return value is not None and self.nonnegative(value, where, depth + 1)
        return False

    def _larger(self, first: _Count | None, second: _Count | None) -> _Count | None:
        """The count both bounds fit in: the larger number, the one parameter they both name, or a parameter C beside
        1 (the clamp's 0 in `max(min(X, C - 1), 0)`: below C where C >= 1, which the copy's branch checks)."""
        if first is None or second is None:
            return None
        if first.value is not None and second.value is not None:
            return first if first.value >= second.value else second
        if first.value is None and second.value is None:
            return first if first.text == second.text else None
        parameter, number = (first, second) if first.value is None else (second, first)
        if number.value == 1:
            self.assumed.add(parameter.text)
            return parameter
        return None

    def _type(self, name: Node) -> str:
        """The declared type of a scalar parameter or a local declared once ("" for anything else)."""
        text = self.parsed.text(name)
        if text in self.scalars and text not in self.declared:
            return self.scalars[text].removeprefix("const ").strip()
        declaration = self._declaration(text)
        kind = declaration.child_by_field_name("type") if declaration is not None else None
        return self.text(kind) if kind is not None else ""

    def _declaration(self, name: str) -> Node | None:
        """The one declaration of local `name` (None where it is declared otherwise or more than once)."""
        if self.declared.count(name) != 1:
            return None
        for declaration in cp.nodes_of_type(self.body, "declaration"):
            for declarator in declaration.children_by_field_name("declarator"):
                if declarator.type == "init_declarator" and \
                        self.parsed.text(declarator.child_by_field_name("declarator")) == name:
                    return declaration
        return None

    def _definition(self, name: Node, at: Node) -> tuple[Node | None, Node]:
        """(value, where it is assigned) of local `name` as `at` reads it: the last of its initializer and its plain
        `name = value;` statements before `at`, each of them in a block that holds `at` (so every path to `at` ran
        it); (None, at) where the local is assigned any other way or is no local of the kernel's."""
        text = self.parsed.text(name)
        declaration = self._declaration(text)
        kind = declaration.child_by_field_name("type") if declaration is not None else None
        if kind is None or self.text(kind) not in _WIDE or not contains(declaration.parent, at):
            return None, at
        if any(parsed_name == text for parsed_name in self._addressed()):
            return None, at
        declarator = next(d for d in declaration.children_by_field_name("declarator")
                          if self.parsed.text(d.child_by_field_name("declarator")) == text)
        found = [(declarator.child_by_field_name("value"), declaration)]
        for use in cp.nodes_of_type(self.body, "identifier"):
            if self.parsed.text(use) != text or not is_written(use):
                continue
            change = use.parent
            while change.type == "parenthesized_expression":
                change = change.parent
            statement = change.parent
            if change.type != "assignment_expression" or operator(change) != "=" or \
                    statement.type != "expression_statement":
                return None, at
            if statement.start_byte < at.start_byte:
                if statement.parent.type != "compound_statement" or not contains(statement.parent, at):
                    return None, at  # assigned on some paths to `at` only
                found.append((change.child_by_field_name("right"), statement))
        value, where = max(found, key=lambda pair: pair[1].start_byte)
        return value, where

    def _addressed(self) -> set[str]:
        names = set()
        for taken in cp.nodes_of_type(self.body, "pointer_expression"):
            argument = unparen(taken.child_by_field_name("argument"))
            if operator(taken) == "&" and argument.type == "identifier":
                names.add(self.parsed.text(argument))
        return names

    def _fact(self, node: Node, at: Node, *, upper: bool) -> _Count | bool | None:
        """What the conditions of the `if`s around `at` say of `node`: a count it is below (`upper`), or whether it
        is >= 0. Read only where `node` means the same in the condition and at `at`: none of its names assigned
        inside the `if`, every array it reads never written by the kernel, no call with an effect."""
        shown = self.text(node)
        outer = at
        while outer is not None and outer != self.body:
            child, outer = outer, outer.parent
            if outer is None or outer.type != "if_statement" or child != outer.child_by_field_name("consequence"):
                continue
            if not self._stable(node, outer):
                continue
            for conjunct in _conjuncts(outer.child_by_field_name("condition")):
                if conjunct.type != "binary_expression":
                    continue
                left, right, op = conjunct.child_by_field_name("left"), conjunct.child_by_field_name("right"), \
                    operator(conjunct)
                if self.text(right) == shown and op in ("<", "<=", ">", ">="):  # `n > b` is `b < n`
                    left, right, op = right, left, {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
                if self.text(left) != shown:
                    continue
                if upper and op == "<" and (bound := self.count(right)) is not None:
                    return bound
                if upper and op == "<=" and (bound := self.last(right)) is not None:
                    return bound
                if not upper and op == ">=" and self.number(right) == 0:
                    return True
        return None

    def _stable(self, node: Node, scope: Node) -> bool:
        names = [self.parsed.text(n) for n in cp.nodes_of_type(node, "identifier")]
        calls = {self.parsed.text(call.child_by_field_name("function")) for call in
                 cp.nodes_of_type(node, "call_expression")}
        written = {self.parsed.text(n) for n in cp.nodes_of_type(scope, "identifier") if is_written(n)}
        if set(names) & (written | self._addressed()) or any(self.declared.count(n) > 1 for n in names):
            return False
        if cp.nodes_of_type(node, "assignment_expression", "update_expression", "pointer_expression"):
            return False
        if first_effect(self.parsed, node) is not None:
            return False
        for read in cp.nodes_of_type(node, "subscript_expression"):
            array = read.child_by_field_name("argument")
            if array.type != "identifier" or not self._read_only(self.parsed.text(array)):
                return False
        return all(name in calls or name in self.scalars or name in self.arrays or name in self.constants or
                   self.declared.count(name) == 1 for name in names)

    def _read_only(self, array: str) -> bool:
        """A pointer parameter the kernel only reads through subscripts."""
        if array not in self.arrays:
            return False
        for use in cp.nodes_of_type(self.body, "identifier"):
            if self.parsed.text(use) != array:
                continue
            read = use.parent
            if read.type != "subscript_expression" or read.child_by_field_name("argument") != use or is_written(read):
                return False
            outer = read.parent
            while outer is not None and outer.type == "parenthesized_expression":
                outer = outer.parent
            if outer is not None and outer.type == "pointer_expression" and operator(outer) == "&" and \
                    not (outer.parent.type == "argument_list" and cp.call_name(outer.parent.parent) == "__ldg"):
                return False
        return True


def _conjuncts(condition: Node) -> list[Node]:
    """The terms of a condition's top-level `&&` (every one holds where the `if` takes its branch)."""
    node = unparen(condition.child_by_field_name("value") or condition)
    if node.type == "binary_expression" and operator(node) == "&&":
        return _conjuncts(node.child_by_field_name("left")) + _conjuncts(node.child_by_field_name("right"))
    return [node]


def _privatized(parsed: cp.ParsedSource, function: cp.Function) -> _Private:
    """The form forward writes in `function`: the static copy's six statements, or the dynamic copy's declaration and
    its branch, ending the kernel; the counting work an `if (i < n)` (the element form) or a loop (the grid-stride
    form)."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    listed = statements(body)
    types = "|".join(re.escape(t) for t in sorted(TYPES, key=len, reverse=True))
    if len(listed) >= 2 and listed[-1].type == "if_statement":
        declared = re.fullmatch(rf"extern __shared__ ({types}) ([A-Za-z_]\w*)\[\];", squash(parsed.text(listed[-2])))
        branch = listed[-1]
        condition = squash(parsed.text(branch.child_by_field_name("condition")))
        bins = re.fullmatch(r"\(([A-Za-z_]\w*) > 0 && \1 <= (\d+)\)", condition)
        alternative = branch.child_by_field_name("alternative")
        naive = next((c for c in alternative.named_children if c.type != "comment"), None) if alternative else None
        consequence = branch.child_by_field_name("consequence")
        if declared and bins and naive is not None and naive.type in _WORK and \
                consequence.type == "compound_statement":
            element, copy = declared[1], declared[2]
            inner = statements(consequence)
            form = _copy_form(parsed, inner, copy, bins[1], listed[-2].start_byte, listed[-1].end_byte, element,
                              naive, int(bins[2]))
            if form is not None:
                indent = indentation(parsed.data, branch.start_byte)
                moved = _shifted(_renamed(parsed, form.guard, copy, form.hist), indent + "    ", len(indent) + 4,
                                 indent)
                if moved != parsed.text(naive):
                    raise NotApplicable(f"{function.name}'s shared copy counts other work than its `else` branch")
                return form
    if len(listed) >= 6:
        declared = re.fullmatch(rf"__shared__ ({types}) ([A-Za-z_]\w*)\[(\w+)\];", squash(parsed.text(listed[-6])))
        if declared:
            form = _copy_form(parsed, listed[-5:], declared[2], declared[3], listed[-6].start_byte,
                              listed[-1].end_byte, declared[1], None, 0)
            if form is not None:
                return form
    raise NotApplicable(f"{function.name} has no shared-memory histogram copy")


def _copy_form(parsed: cp.ParsedSource, inner: list[Node], copy: str, count: str, start: int, end: int,
               element: str, naive: Node | None, cap: int) -> _Private | None:
    """The zeroing loop, barrier, counting work, barrier and flushing loop over `copy` (None where `inner` is not
    exactly those), each use of the copy one forward writes."""
    if len(inner) != 5:
        return None
    zero, first, guard, second, flush = inner
    if squash(parsed.text(first)) != "__syncthreads();" or squash(parsed.text(second)) != "__syncthreads();" or \
            guard.type not in _WORK or guard.child_by_field_name("alternative") is not None:
        return None
    k = re.fullmatch(r"for \(int ([A-Za-z_]\w*) = threadIdx\.x;.*", squash(parsed.text(zero)))
    if k is None:
        return None
    flushed = re.fullmatch(re.escape(squash(_Loops(copy, "@", count, k[1]).flush(""))).replace("@", r"([A-Za-z_]\w*)"),
                           squash(parsed.text(flush)))
    if squash(parsed.text(zero)) != _Loops(copy, "", count, k[1]).zero or flushed is None:
        return None
    uses = [node for node in cp.nodes_of_type(guard, "identifier") if parsed.text(node) == copy]
    calls = [call for call in cp.nodes_of_type(guard, "call_expression") if cp.call_name(call) == "atomicAdd"]
    bases = [address[0] for call in calls if (address := _address(parsed, call, {copy})) is not None]
    if not uses or uses != bases or any(call.parent.type != "expression_statement" for call in calls):
        return None
    return _Private(copy, flushed[1], element, count, start, end, guard, naive, cap)


def _renamed(parsed: cp.ParsedSource, guard: Node, old: str, new: str) -> str:
    """The text of `guard` with `old` -> `new` at each identifier."""
    start = guard.start_byte
    edits = [(a - start, b - start, text) for a, b, text in _renames(parsed, guard, old, new)]
    return splice(parsed.data[start:guard.end_byte], edits)[0].decode("utf-8")


register(UnprivatizeHistogram())
