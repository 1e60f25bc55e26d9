"""unaggregate_atomics: a warp's atomic adds (or maxima, or minima) folded by shuffles and made once per warp become
one atomic per thread; forward finds its sites by analysis.

The mechanism (forward): a kernel that sums into one place with atomics (a loss, a dot product, a norm, a count),
or takes a maximum or minimum there (an absolute maximum for a quantization scale, a first index), makes 32
atomics per warp on one address, each waiting for the last. Three naive forms are read:

- the element form (`if (i < n) { ...; atomicAdd(out, v); }`, in either naive spelling): every `atomicAdd(P, v)`
  of the element's work becomes `total += v` on a running total; after the guard, where every lane of the warp
  arrives, a butterfly of `__shfl_xor_sync` sums the warp's totals, and its first lane makes the one atomic add:

      int i = blockIdx.x * blockDim.x + threadIdx.x;
      float warp_total = 0;
      if (i < n) { ...; warp_total += v; }
      for (int offset = 16; offset > 0; offset /= 2) warp_total += __shfl_xor_sync(0xffffffffu, warp_total, offset);
      if (threadIdx.x % 32 == 0) atomicAdd(out, warp_total);

- the loop form: the kernel is one grid-stride loop over elements (`_grid_stride`'s spellings, its stride maybe
  declared first) whose work makes the atomics. The total is declared before the loop and folds every element the
  thread visits, so a grid of G blocks makes G * warps-a-block atomics however many elements there are; the grid
  and the loop stay as written (read as the element form instead, the loop would go and its grid with it).
- the tail form: each thread sums its own share first (a grid-stride loop, say), then makes one `atomicAdd(P, v);`
  that every thread reaches, a statement of the kernel's body. Its value starts the total (`float warp_total =
  v;`), and the same butterfly and warp's atomic follow. The kernel may go on after it where P is shared memory
  (a block's sum: `atomicAdd(&block_sum, part); __syncthreads();`, then every thread reads the sum): 8 atomics a
  block of 256 threads instead of 256 on one shared address.

An element-form kernel has a second site, key `<total>@grid`: the same fold with the element's work in a grid-stride
loop (`for (int i = <index>; i < n; i += blockDim.x * gridDim.x)`, the locals before the guard kept before it) on
min(its grid, num_sms * K) blocks, K the blocks of its size an SM holds (`_grid_free.blocks_per_sm`): each thread
folds several elements before its warp's one atomic, so the GPU makes a few thousand atomics whatever n, where the
plain fold makes n / 32, all queued at one address. The loop visits every element once on any grid and the work is
the element form's (no loop, barrier, collective or exit), so the elements stay independent. Backward reads that
kernel in the loop form (the walk's inverse is the loop making the atomics, which computes the same).

The sum is reassociated: integers sum to the same value, floating point to one of the values the naive kernel's
unordered atomics could already give, rounded differently (the gate's tolerance judges it).

`atomicMax(P, v)` and `atomicMin(P, v)` (integers only, as CUDA has them) fold the same way, exactly: the total
starts at the operation's identity (int's least value for a maximum, say), each `atomicMax(P, v)` becomes
`total = max(total, (T)(v))` with T the element type (the conversion atomicMax's parameter makes: `max` of mixed
int and unsigned would compare as unsigned), the butterfly takes `max` of the lanes, and lane 0 makes one
`atomicMax`. A warp whose lanes all miss the guard makes its atomic with the identity, which changes nothing.

Legality (forward_sites), decided on the parse and the plan: every launch is 1-D and its block a literal multiple
of 32 (whole warps: the shuffle needs every lane); the atomics are statements of one operation (their old value
unused), one P in all, naming only kernel parameters it never assigns, the block's index and the launch's extents
(`out`, `out + k`, `&out[k]`, `&out[blockIdx.x]`: a block-per-row sum), so every lane of a warp adds to the same
place; P's array is not otherwise touched by the kernel, and its element type is one the atomic takes (atomicAdd:
float, double, int, unsigned or unsigned long long; atomicMax and atomicMin: int, unsigned, long long or unsigned
long long). The element form's work is what `_naive.element_work` reads (no loop, barrier, collective or early
exit); the loop form's work may branch and loop but not return or `goto`; the tail form's atomic is the kernel's
only one, a statement of its body (outside any branch or loop), and the kernel has no `return` or `goto`: in every
form every lane of the warp arrives at the butterfly. In the tail form P may instead be a `__shared__` variable of
the kernel (`&s`, `&s[k]`, `s + k`, k named as above), touched before the atomic as the kernel likes (zeroed by one
thread, say) and after it only past a `__syncthreads();` of the kernel's body: the block's sum is then whole
whichever lane added it. Where P is global the atomic ends the kernel.

Backward serializes the forms forward writes: each fold of the guarded work or the loop (`total += v`, `total =
max(total, (T)(v))`) becomes `atomicAdd(P, v)` (`atomicMax(P, v)`) again, or the tail's total `v` its one atomic;
the total, the butterfly and the warp's atomic go.

Anchor: the kernel, kind "function", key the total's name (`warp_total`, `warp_max`, `warp_min`), with `@grid` for
the element form over a grid the GPU's size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.transforms import register
from klineage.transforms._canonical import canonical
from klineage.transforms._edit import call_arguments, indentation, is_written, splice
from klineage.transforms._flatten import flattened
from klineage.transforms._grid_free import SMS, blocks_per_sm
from klineage.transforms._grid_stride import read_grid_stride, stride_local
from klineage.transforms._naive import (
    ElementWork,
    between,
    element_work,
    if_form,
    kernel,
    launches_of,
    parameters,
    readable,
    rescaled_grid,
    squash,
    statements,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform, refused

_INT_TYPES = ("int", "unsigned", "unsigned int", "long long", "unsigned long long")


@dataclass(frozen=True)
class _Fold:
    """One atomic operation a warp folds: the atomic's name, the total's name, the element types the atomic takes,
    the value that changes nothing (per type) and the fold of a value into the total."""
    atomic: str
    total: str
    identities: tuple[tuple[str, str], ...]  # (element type, identity): the types the atomic takes

    def takes(self, element: str) -> bool:
        return element in dict(self.identities)

    def identity(self, element: str) -> str:
        return dict(self.identities)[element]

    def combine(self, total: str, value: str) -> str:
        """The statement that folds `value` into `total`."""
        if self.atomic == "atomicAdd":
            return f"{total} += {value};"
        return f"{total} = {self.atomic.removeprefix('atomic').lower()}({total}, {value});"

    def fold(self, total: str, value: str, element: str) -> str:
        """A lane's value folded in; a maximum or minimum converts it to the element type first, as the atomic's
        parameter would."""
        return self.combine(total, value if self.atomic == "atomicAdd" else f"({element})({value})")

    def butterfly(self, total: str) -> str:
        shuffled = f"__shfl_xor_sync(0xffffffffu, {total}, offset)"
        return f"for (int offset = 16; offset > 0; offset /= 2) {self.combine(total, shuffled)}"

    def warp_atomic(self, target: str, total: str) -> str:
        return f"if (threadIdx.x % 32 == 0) {self.atomic}({target}, {total});"

    def folded_value(self, total: str, element: str, statement: str) -> str | None:
        """v where `statement` (squashed) is this fold of v into `total`, else None."""
        pattern = re.escape(self.fold(total, "\0", element)).replace(re.escape("\0"), "(.+)")
        found = re.fullmatch(pattern, statement)
        return found[1] if found else None


_LEAST = {"int": "(-2147483647 - 1)", "long long": "(-9223372036854775807LL - 1)"}
_MOST = {"int": "2147483647", "unsigned": "0xffffffffu", "unsigned int": "0xffffffffu",
         "long long": "9223372036854775807LL", "unsigned long long": "0xffffffffffffffffull"}
FOLDS = (
    _Fold("atomicAdd", "warp_total", tuple((kind, "0") for kind in ("float", "double", "int", "unsigned",
                                                                    "unsigned int", "unsigned long long"))),
    _Fold("atomicMax", "warp_max", tuple((kind, _LEAST.get(kind, "0")) for kind in _INT_TYPES)),
    _Fold("atomicMin", "warp_min", tuple((kind, _MOST[kind]) for kind in _INT_TYPES)),
)
_BY_ATOMIC = {fold.atomic: fold for fold in FOLDS}
_ATOMICS = "atomicAdd, atomicMax or atomicMin"
OVER_GRID = "@grid"  # the element form's key suffix: its elements in a grid-stride loop on a grid the GPU's size


@dataclass(frozen=True)
class _Site:
    function: cp.Function
    span: Node  # what forward replaces: the guard `if (i < n) <work>`, or the tail's `atomicAdd(P, v);`
    target: str  # P, as written
    element: str  # P's element type
    adds: tuple[Node, ...]  # the `atomicAdd(P, v)` (atomicMax, atomicMin) calls
    fold: _Fold
    total: str
    tail: bool  # the tail form: one atomic every thread makes last
    work: ElementWork | None = None  # the element form's index, guard and work


@dataclass(frozen=True)
class _Aggregated:
    """The form forward writes: the total's declaration, the guard (None in the tail form), the warp's atomic."""
    total: str
    declaration: Node
    value: str  # the declaration's initial value: the identity in the element form, the tail's v
    guard: Node | None
    warp_add: Node
    target: str
    fold: _Fold
    element: str


class UnaggregateAtomics(Transform):
    name = "unaggregate_atomics"
    intent = ("Fold a warp's atomic adds (maxima, minima) to one address with register shuffles and let one lane "
              "make a single atomic per warp.")
    removes = ("shfl",)  # the butterfly: cards of warp shuffles lend it their sites
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", form.total, parsed.text(function.node)[:200])
                for function, form in readable(parsed, lambda f: _aggregated(parsed, f))]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        # the element form over a grid the GPU's size first: on an H100 an amax folded so was 8.2x the plain warp
        # fold, which the hardware's own merging of a warp's same-address atomics had left at 1.0x
        # (bench/logs/gpu-session-s62.txt, call 2)
        _, parsed, found = _read(state)
        return [Anchor(function.name, "function", key, parsed.text(site.span)[:200]) for function, site in found
                for key in ((f"{site.total}{OVER_GRID}", site.total) if site.work is not None else (site.total,))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state, parsed, found = _read(state)
        function = kernel(parsed, anchor)
        sites = [site for named, site in found if named.name == function.name]
        site = sites[0] if sites else _loop(state, parsed, function) or _serial(state, parsed, function)
        over_grid = anchor.key == f"{site.total}{OVER_GRID}" and site.work is not None
        if site.total != anchor.key and not over_grid:
            raise NotApplicable(f"{anchor}: the total would be '{site.total}'")
        indent = indentation(parsed.data, site.span.start_byte)
        fold, element, plan = site.fold, site.element, state.plan
        start, end = site.span.start_byte, site.span.end_byte
        if site.tail:
            lines = [f"{element} {site.total} = {parsed.text(call_arguments(site.adds[0])[1])};"]
        else:
            edits = [(add.parent.start_byte, add.parent.end_byte,
                      fold.fold(site.total, parsed.text(call_arguments(add)[1]), element)) for add in site.adds]
            guard = splice(parsed.data[start:end], [(a - start, b - start, text) for a, b, text in edits])[0]
            guard = guard.decode("utf-8")
            lines = [f"{element} {site.total} = {fold.identity(element)};", indent + guard]
            if over_grid:  # from the index's declaration, which the loop's header takes
                kept, loop, plan = _over_grid(state, parsed, site, guard)
                lines, start = [kept + lines[0], indent + loop], site.work.start
        text = "\n".join([*lines, indent + fold.butterfly(site.total),
                          indent + fold.warp_atomic(site.target, site.total)])
        source = splice(parsed.data, [(start, end, text)])[0].decode("utf-8")
        spread = f", each thread's elements a grid apart on {plan.launches[0].grid[0]} blocks" if over_grid else ""
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan,
                            note=f"{site.function.name}: a warp's {fold.atomic} calls to {site.target} folded by "
                                 f"shuffles, one {fold.atomic} per warp{spread}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        form = _aggregated(parsed, function)
        if form.total != anchor.key:
            raise NotApplicable(f"{anchor}: the total is '{form.total}'")
        atomic = form.fold.atomic
        if form.guard is None:
            edits = [(form.declaration.start_byte, form.warp_add.end_byte, f"{atomic}({form.target}, {form.value});")]
        else:
            edits = []
            for node in cp.nodes_of_type(form.guard, "expression_statement"):
                value = form.fold.folded_value(form.total, form.element, squash(parsed.text(node)))
                if value is not None:
                    edits.append((node.start_byte, node.end_byte, f"{atomic}({form.target}, {value});"))
            edits += [(form.declaration.start_byte, form.guard.start_byte, ""),
                      (form.guard.end_byte, form.warp_add.end_byte, "")]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: one {atomic} to {form.target} per thread")


def _over_grid(state: KernelState, parsed: cp.ParsedSource, site: _Site, guard: str) -> tuple[str, str, LaunchPlan]:
    """The element form's folded guard `guard` as a grid-stride loop on at most a full GPU of blocks: (the locals
    between the index and its guard, which stay before the loop: none names the index; the loop; the plan)."""
    work = site.work
    folded = guard[site.span.child_by_field_name("consequence").start_byte - site.span.start_byte:]
    loop = f"for ({work.kind} {work.index} = {work.init}; {work.index} < {work.bound}; " \
           f"{work.index} += blockDim.x * gridDim.x) {folded}"
    ahead = between(work.locals)
    kept = parsed.data[ahead[0].node.start_byte:work.guard.start_byte].decode("utf-8") if ahead else ""
    name = site.function.name
    plan = rescaled_grid(state, name, lambda grid: f"min({grid}, {SMS} * {blocks_per_sm(state, name)})")
    return kept, loop, plan


def _read(state: KernelState) -> tuple[KernelState, cp.ParsedSource, list[tuple[cp.Function, _Site]]]:
    """The state forward reads and its sites: the kernels that are one grid-stride loop making the atomics (kept
    loops: each thread's elements fold into its total), else every kernel read in the naive forms (`_serial`)."""
    state = canonical(state)
    parsed = cp.parse(state.source)
    looped, loops_refused = [], False
    for function in cp.functions(parsed):
        try:
            site = _loop(state, parsed, function)
        except NotApplicable as refusal:
            refused(function, refusal)
            loops_refused = True
            continue
        if site is not None:
            looped.append((function, site))
    if looped or loops_refused:
        return state, parsed, looped
    state = if_form(flattened(state))  # the index and guard as the naive form spells them, 1-D
    parsed = cp.parse(state.source)
    return state, parsed, readable(parsed, lambda f: _serial(state, parsed, f))


def _loop(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> _Site | None:
    """The loop form's site, where the kernel is one grid-stride loop over elements (its stride maybe declared
    first) whose work makes atomics; None where it is not such a kernel. Every lane leaves the loop and reaches
    the butterfly after it unless the work returns."""
    body = function.node.child_by_field_name("body")
    listed = statements(body) if function.is_kernel and body is not None else []
    if not listed or listed[-1].type not in ("for_statement", "while_statement"):
        return None
    try:
        loop = read_grid_stride(parsed, function, listed, listed[-1])
    except NotApplicable:
        return None
    calls = [call for call in cp.nodes_of_type(loop.body, "call_expression") if cp.call_name(call).startswith("atomic")]
    if not calls:
        return None
    if loop.before and (len(loop.before) > 1 or stride_local(parsed, loop.before[0]) is None):
        raise NotApplicable(f"{function.name} does more than declare its stride before its grid-stride loop")
    if re.search(r"\b(?:return|goto)\b", loop.work):
        raise NotApplicable(f"{function.name}'s loop can leave the kernel: a lane that leaves misses the butterfly")
    _check_whole_warps(state, function)
    return _site(parsed, function, loop.loop, tuple(calls), _one_fold(function, calls), tail=False)


def _one_fold(function: cp.Function, calls: list[Node]) -> _Fold:
    """The fold of `calls`, atomic statements of one operation, or NotApplicable."""
    kinds = {cp.call_name(call) for call in calls}
    fold = _BY_ATOMIC.get(kinds.pop()) if len(kinds) == 1 else None
    if fold is None or any(call.parent.type != "expression_statement" for call in calls):
        raise NotApplicable(f"{function.name}'s work makes no {_ATOMICS}, or other atomics, or atomics of two "
                            f"kinds, or uses one's old value")
    return fold


def _serial(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> _Site:
    """The naive form's atomics in `function` (the element form, else the tail form), or NotApplicable with the
    reason."""
    try:
        work = element_work(state, parsed, function)
    except NotApplicable as refusal:
        return _tail(state, parsed, function, refusal)
    _check_whole_warps(state, function)
    calls = [call for node in work.nodes for call in cp.nodes_of_type(node, "call_expression")
             if cp.call_name(call).startswith("atomic")]
    site = _site(parsed, function, work.nodes[0].parent, tuple(calls), _one_fold(function, calls), tail=False)
    return replace(site, work=work)


def _tail(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, refusal: NotApplicable) -> _Site:
    """The tail form: one `atomicAdd(P, v);`, a statement of the kernel's body that every thread reaches, the
    kernel's last where P is global; where the kernel makes none, the element form's refusal is the reason."""
    body = function.node.child_by_field_name("body")
    listed = [node for node in body.named_children if node.type != "comment"] if body is not None else []
    calls = [node for node in cp.nodes_of_type(body, "call_expression") if cp.call_name(node).startswith("atomic")]
    made = [node for node in listed if node.type == "expression_statement" and node.named_children and
            node.named_children[0].type == "call_expression" and cp.call_name(node.named_children[0]) in _BY_ATOMIC]
    if not made:
        raise NotApplicable(f"{refusal}; nor does its body make an {_ATOMICS} that every thread makes") from None
    statement = made[-1]
    call = statement.named_children[0]
    fold = _BY_ATOMIC[cp.call_name(call)]
    if cp.nodes_of_type(body, "return_statement") or cp.nodes_of_type(body, "goto_statement"):
        raise NotApplicable(f"{function.name} can leave before its {fold.atomic}: a lane that leaves misses the "
                            f"warp's butterfly")
    if calls != [call]:
        raise NotApplicable(f"{function.name} makes atomics besides its {fold.atomic}")
    _check_whole_warps(state, function)
    shared = _shared_target(parsed, function, call)
    if shared is not None:
        return _shared_site(parsed, function, statement, call, listed, shared, fold)
    if statement is not listed[-1]:
        raise NotApplicable(f"{function.name} goes on after its {fold.atomic} to global memory")
    return _site(parsed, function, statement, (call,), fold, tail=True)


def _shared_target(parsed: cp.ParsedSource, function: cp.Function, call: Node) -> cp.Declaration | None:
    """The kernel's `__shared__` variable the atomic's address names, or None."""
    named = set(re.findall(r"[A-Za-z_]\w*", parsed.text(call_arguments(call)[0])))
    found = [d for d in cp.declarations(parsed) if d.function == function.name and "__shared__" in d.specifiers
             and d.name in named]
    return found[0] if len(found) == 1 else None


def _shared_site(parsed: cp.ParsedSource, function: cp.Function, statement: Node, call: Node, listed: list[Node],
                 shared: cp.Declaration, fold: _Fold) -> _Site:
    """The tail form's site where the atomic adds to the kernel's shared variable `shared`: at one place for the
    block (the address names the variable, kernel parameters it never assigns, the block's index, the launch's
    extents and literals), the variable touched after the atomic only past a barrier of the kernel's body."""
    target = squash(parsed.text(call_arguments(call)[0]))
    params = {name for name, _, _ in parameters(parsed, function)}
    body = function.node.child_by_field_name("body")
    named = _address_names(target) - {shared.name}
    if not named <= params or shared.indirection:
        raise NotApplicable(f"{function.name} adds to `{target}`, which names more than its shared variable, its "
                            "parameters and the block's index")
    _check_unassigned(parsed, function, named)
    barriers = [node for node in listed[listed.index(statement) + 1:]
                if squash(parsed.text(node)) == "__syncthreads();"]
    fence = barriers[0].start_byte if barriers else body.end_byte
    for use in cp.nodes_of_type(body, "identifier"):
        if parsed.text(use) == shared.name and statement.end_byte <= use.start_byte < fence:
            raise NotApplicable(f"{function.name} touches '{shared.name}' after its {fold.atomic} before a barrier")
    if not fold.takes(shared.type):
        raise NotApplicable(f"'{shared.name}' holds {shared.type}, which {fold.atomic} does not take")
    return _Site(function, statement, target, shared.type, (call,), fold, _total_name(parsed, function, fold), True)


def _check_whole_warps(state: KernelState, function: cp.Function) -> None:
    for launch in launches_of(state, function.name, dimensions=1):
        block = str(launch.block[0]).strip()
        if not block.isdigit() or int(block) % 32:
            raise NotApplicable(f"{function.name}'s block of {block} threads is no whole number of warps")


def _site(parsed: cp.ParsedSource, function: cp.Function, span: Node, adds: tuple[Node, ...], fold: _Fold,
          tail: bool) -> _Site:
    """The site of `adds`, once they all add to one place of one array the kernel touches nowhere else."""
    targets = {squash(parsed.text(call_arguments(call)[0])) for call in adds}
    if len(targets) != 1 or any(len(call_arguments(call)) != 2 for call in adds):
        raise NotApplicable(f"{function.name}'s atomics add to {len(targets)} places, not one")
    target = targets.pop()
    params = {name: (kind, pointer) for name, kind, pointer in parameters(parsed, function)}
    named = _address_names(target)
    arrays = [name for name in named if params.get(name, ("", False))[1]]
    if not named <= set(params) or len(arrays) != 1:
        raise NotApplicable(f"{function.name} adds to `{target}`, which names more than its parameters, the "
                            "block's index and one array")
    array = arrays[0]
    _check_unassigned(parsed, function, named)
    for use in cp.nodes_of_type(function.node.child_by_field_name("body"), "identifier"):
        if parsed.text(use) == array and not any(_within(use, call_arguments(call)[0]) for call in adds):
            raise NotApplicable(f"{function.name} touches '{array}' beyond its atomic adds")
    element = params[array][0].removeprefix("const ").strip()
    if not fold.takes(element):
        raise NotApplicable(f"'{array}' points to {element}, which {fold.atomic} does not take")
    return _Site(function, span, target, element, adds, fold, _total_name(parsed, function, fold), tail)


def _address_names(target: str) -> set[str]:
    """The names an atomic's address reads beside the block's index and the launch's extents, which are the same in
    every lane of a warp (a row's sum at `&out[blockIdx.x]`)."""
    return set(re.findall(r"[A-Za-z_]\w*", re.sub(r"\b(?:blockIdx|gridDim|blockDim)\.[xyz]\b", "", target)))


def _check_unassigned(parsed: cp.ParsedSource, function: cp.Function, names: set[str]) -> None:
    """NotApplicable where the kernel assigns one of the names the atomics' address reads: the place would move."""
    for use in cp.nodes_of_type(function.node.child_by_field_name("body"), "identifier"):
        if parsed.text(use) in names and is_written(use):
            raise NotApplicable(f"{function.name} assigns '{parsed.text(use)}', which its atomics' address names")


def _total_name(parsed: cp.ParsedSource, function: cp.Function, fold: _Fold) -> str:
    """The warp total's name: the first of its spellings the kernel does not name."""
    taken = {parsed.text(node) for node in cp.nodes_of_type(function.node, "identifier")}
    total = fold.total
    return next(name for name in (total, f"{total}_", f"{total}__", f"{total}_of_warp") if name not in taken)


def _into_shared(parsed: cp.ParsedSource, function: cp.Function, warp_add: Node) -> bool:
    """Whether the warp's atomic `if (...) atomicAdd(P, total);` goes into a `__shared__` variable of the kernel."""
    consequence = warp_add.child_by_field_name("consequence")
    call = consequence.named_children[0] if consequence is not None and consequence.named_children else None
    return call is not None and call.type == "call_expression" and _shared_target(parsed, function, call) is not None


def _within(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def _aggregated(parsed: cp.ParsedSource, function: cp.Function) -> _Aggregated:
    """The form forward writes in `function`: the element form's four statements or the tail form's three."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    listed = [node for node in body.named_children if node.type != "comment"]
    types = "|".join(sorted({kind for fold in FOLDS for kind, _ in fold.identities}))
    for at in range(len(listed) - 2):
        declared = re.fullmatch(rf"({types}) ([A-Za-z_]\w*) = (.+);", squash(parsed.text(listed[at])))
        if declared is None:
            continue
        element, total, value = declared[1], declared[2], declared[3]
        for fold in FOLDS:
            if not fold.takes(element):
                continue
            # the element form's guard, or the loop form's loop (not the butterfly: that follows a tail's total)
            guarded = (value == fold.identity(element) and
                       listed[at + 1].type in ("if_statement", "for_statement", "while_statement") and
                       squash(parsed.text(listed[at + 1])) != fold.butterfly(total))
            rest = listed[at + 2:] if guarded else listed[at + 1:]
            if len(rest) < 2:  # the butterfly and the warp's atomic follow
                continue
            butterfly, warp_add = rest[:2]
            target = re.fullmatch(re.escape(fold.warp_atomic("@", total)).replace("@", "(.+)"),
                                  squash(parsed.text(warp_add)))
            # they end the kernel, as forward writes them, but for a tail's fold into shared memory
            ends = len(rest) == 2 or (not guarded and _into_shared(parsed, function, warp_add))
            if squash(parsed.text(butterfly)) == fold.butterfly(total) and target and ends:
                return _Aggregated(total, listed[at], value, listed[at + 1] if guarded else None, warp_add,
                                   target[1], fold, element)
    raise NotApplicable(f"{function.name} has no warp-aggregated atomic")


register(UnaggregateAtomics())
