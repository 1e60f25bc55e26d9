"""unsplit_reduction: a reduction split into chunks of rows, each chunk's partial kept and merged by a second
launch, becomes the one loop of one thread.

The mechanism (forward): a kernel of one thread per output (a column sum, a column argmax, the norm of few long
rows) whose one loop reduces a long range (`for (int r = 0; r < rows; ++r) s += x[r * cols + c];`) has as many
threads as outputs: where outputs are few (64 columns of 262,144 rows) one block does all the work. Forward splits
the loop's range into chunks of `split_steps` steps on a second grid dimension: block (x, y) runs the kernel's
threads over chunk y, each from the values its accumulators start with, and stores what it reduced to scratch
(`split_<accumulator>[y * outputs + c]`) instead of running the code after the loop. A second launch,
`<kernel>_merge`, runs the kernel once more per output with the loop replaced by a walk over the chunks in order,
combining their partials (a sum adds them, an extreme takes the extreme, a (value, index) pair keeps the better
value and on equal values the smaller index), then the code after the loop as written. As in
serialize_reduction's lanes, every chunk starts from the same values: a sum from zero, an extreme or an arg
reduction from its start (which each chunk takes again harmlessly, and whose pair a chunk keeps only where no
step beat it strictly, so the merged pair is the sequential loop's, ties and NaNs included).

The plan computes `split_steps` for each case and GPU, so that the outputs' threads times the chunks fill every SM
once (num_sms x 2048 threads): a chunk long enough to be worth its partial (32 steps at least), and few enough
chunks for grid y (65,535 at most). A fixed chunk length could not: 128 steps left half an H100 idle on 1,024
columns of 16,384 rows, and ran past grid y's limit beyond 8.4 million rows.

Legality: what serialize_reduction reads (klineage/transforms/_warp_reduction.py: one thread per row, its
accumulators, pure calls, no shared memory or barrier), plus:
- exactly one loop, which only reduces (no store, no running sum), directly in the kernel's body or in its guard;
- the guard is `if (row >= N) return;` before the loop or `if (row < N) { ... }` around it, and N and the loop's bound
  are names the plan can say (scalar parameters or constants) or products or sums of them (`B * D`: a batch of column
  sums, one thread per output); N may be a number (`row < 1`: a kernel one thread runs, read as one row by
  `_flatten.py`, as are `<<<rows, 1>>>` kernels and grid-stride loops over rows). The guard alone keeps a thread's
  partial inside the scratch (`chunk * N + row`, row < N), whatever else N counts; the kernel neither assigns nor
  declares again a name of N or of the bound, so the plan's values are the kernel's;
- code after the loop (which the merge runs) exists and nothing follows the guard's block;
- the kernel's one launch is one-dimensional, it never names blockIdx.y or blockIdx.z (grid y becomes the chunk)
  and no name of the kernel starts with `split`.

Backward writes the merge kernel back as the kernel, with the chunk walk replaced by the loop of the chunk
kernel over its whole range; the chunk kernel, `split_steps` and the scratch go.

Anchor: the kernel, kind "function", key the row variable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.launch import Arg, ArgKind, Launch, Scratch
from klineage.transforms import register
from klineage.transforms._arg_reduction import pair_join
from klineage.transforms._edit import Edit, indentation, line_start, splice
from klineage.transforms._naive import (
    INTEGER_CAST,
    bound_of,
    kernel,
    launch_scalars,
    launches_of,
    readable,
    squash,
    statements,
)
from klineage.transforms._row_count import check_fixed, guard_count, plan_value
from klineage.transforms._warp_reduction import RowLoop, Site, as_rows, serial_site
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

STEPS = "split_steps"  # the kernels' parameter: how many steps a chunk reduces
MIN_STEPS = 32  # a chunk's partial costs a store and a load of the merge: at 32 steps, about 3% of its loads
SM_THREADS = 2048  # the threads an SM holds on sm_75 and later (sm_86 and sm_89 hold 1,536: a wave too many)
MAX_GRID_Y = 65535
_MERGE = "_merge"
# a partial's scratch dtype (its size is what counts: an unsigned partial travels in int32 storage)
_DTYPES = {"float": "float32", "double": "float64", "int": "int32", "unsigned": "int32", "unsigned int": "int32",
           **dict.fromkeys(("long long", "long", "int64_t", "long long int", "long int"), "int64")}
_SPLIT_LOOP = re.compile(r"^for \((.+?) split = 0; split < \((.+?) \+ split_steps - 1\) / split_steps; \+\+split\)")
_CHUNK_HEADER = re.compile(r"^for \((.+?) (\w+) = (split_first|split_first < (\w+) \? \4 : split_first); \2 < (.+?) && "
                           r"\2 < split_first \+ split_steps; \+\+\2\)")


@dataclass(frozen=True)
class Split:
    site: Site
    loop: RowLoop
    bound: str  # the loop's bound
    outputs: str  # N of the guard: how many rows (outputs) there are
    after: tuple[Node, ...]  # the statements after the loop, which the merge runs
    launch: Launch  # the kernel's one launch
    said: tuple[str, str]  # the bound and N as the plan says them


class UnsplitReduction(Transform):
    name = "unsplit_reduction"
    intent = ("Split a thread's long reduction loop into chunks on a second grid dimension, keep each chunk's "
              "partial in scratch and merge the partials in order in a second launch, so a reduction with few "
              "outputs fills the GPU.")
    removes = ()
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        names = {f.name for f in cp.functions(parsed)}
        found = []
        for function in cp.functions(parsed):
            if function.is_kernel and f"{function.name}{_MERGE}" in names:
                for declaration in cp.nodes_of_type(function.node, "declaration"):
                    if squash(parsed.text(declaration)).startswith("const ") and "split_first" in parsed.text(
                            declaration):
                        found.append(Anchor(function.name, "function", _row_of(parsed, function),
                                            parsed.text(declaration)))
        return found

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        # as the warp reductions read rows: a perfect nest one loop over its pairs, the row shapes people write (a
        # kernel one thread runs, `<<<rows, 1>>>`, a grid-stride loop over rows) one thread per row
        state = as_rows(state)
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", split.site.row, parsed.text(split.loop.node)[:200])
                for function, split in readable(parsed, lambda f: _split(state, parsed, f))]

    # -- forward --------------------------------------------------------------------------------

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = as_rows(state, anchor.function)
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        split = _split(state, parsed, function)
        if split.site.row != anchor.key:
            raise NotApplicable(f"{anchor}: the row variable is '{split.site.row}'")
        data, loop, row = parsed.data, split.loop, split.site.row
        accumulators = [acc.name for acc in loop.accumulators]
        types = {name: split.site.types[name] for name in accumulators}
        params_end = _declarator(function, "parameters").end_byte - 1  # before `)`
        indent = indentation(data, loop.node.start_byte)
        header_end = loop.node.child_by_field_name("body").start_byte
        chunk = [Edit(params_end, params_end, f", int {STEPS}" + "".join(f", {types[a]}* __restrict__ split_{a}"
                                                                      for a in accumulators)),
                 Edit(loop.node.start_byte, loop.node.start_byte,
                      f"const {loop.kind} split_first = ({loop.kind})blockIdx.y * {STEPS};\n{indent}"),
                 Edit(loop.node.start_byte, header_end,
                      f"for ({loop.kind} {loop.index} = {_chunk_start(loop.start)}; "
                      f"{loop.index} < {split.bound} && {loop.index} < split_first + {STEPS}; ++{loop.index}) "),
                 Edit(split.after[0].start_byte, split.after[-1].end_byte,
                      f"\n{indent}".join(f"split_{a}[{_offset('blockIdx.y', split.outputs)} + {row}] = {a};"
                                         for a in accumulators))]
        merge = [Edit(params_end, params_end,
                      f", int {STEPS}" + "".join(f", const {types[a]}* __restrict__ split_{a}" for a in accumulators)),
                 Edit(loop.node.start_byte, loop.node.end_byte, _merge_loop(loop, split, types, indent))]
        name = _declarator(function, "declarator")
        merge.append(Edit(name.end_byte, name.end_byte, _MERGE))
        start, end = line_start(data, function.node.start_byte), function.node.end_byte
        source = (data[:start] + _edited(data, start, end, chunk) + b"\n\n" + _edited(data, start, end, merge)
                  + data[end:])
        plan = _split_plan(state, function, split, types)
        source = source.decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan,
                            note=f"{function.name}'s loop over {split.bound} in chunks on grid y, as many as fill the "
                                 f"GPU, "
                                 f"{', '.join(accumulators)} merged in chunk order by {function.name}{_MERGE}")

    # -- backward -------------------------------------------------------------------------------

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        chunk = kernel(parsed, anchor)
        merge = next((f for f in cp.functions(parsed) if f.name == f"{chunk.name}{_MERGE}"), None)
        if merge is None:
            raise NotApplicable(f"{anchor}: no {chunk.name}{_MERGE}")
        data = parsed.data
        chunk_loop = _only_loop(chunk, lambda node: _CHUNK_HEADER.match(_header(parsed, node)))
        kind, index, _, start, bound = _CHUNK_HEADER.match(_header(parsed, chunk_loop)).groups()
        start = start or "0"
        merge_loop = _only_loop(merge, lambda node: _SPLIT_LOOP.match(_header(parsed, node)))
        indent = indentation(data, merge_loop.start_byte)
        body = parsed.text(chunk_loop.child_by_field_name("body"))
        loop_text = f"for ({kind} {index} = {start}; {index} < {bound}; ++{index}) {body}"
        if indentation(data, chunk_loop.start_byte) != indent:
            raise NotApplicable(f"{anchor}: the chunk loop and the merge's walk sit at other depths")
        params = _declarator(merge, "parameters").named_children
        added = [p for p in params if re.search(r"\bsplit_\w+\s*$", parsed.text(p))]
        if len(added) < 2 or added != params[-len(added):] or squash(parsed.text(added[0])) != f"int {STEPS}":
            raise NotApplicable(f"{anchor}: {merge.name}'s last parameters are not `int {STEPS}` and its scratch")
        name = _declarator(merge, "declarator")
        edits = [Edit(name.start_byte, name.end_byte, chunk.name),
                 Edit(added[0].prev_sibling.start_byte, added[-1].end_byte, ""),
                 Edit(merge_loop.start_byte, merge_loop.end_byte, loop_text)]
        start, end = line_start(data, merge.node.start_byte), merge.node.end_byte
        merge_text = _edited(data, start, end, edits)
        chunk_start = line_start(data, chunk.node.start_byte)
        source = (data[:chunk_start] + merge_text + data[end:]).decode()
        plan = _unsplit_plan(state, chunk.name, len(added))
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            note=f"{chunk.name}'s chunks and {merge.name} merged back into one loop over {bound}")


def _split(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> Split:
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is not a kernel")
    body = function.node.child_by_field_name("body")
    if {squash(parsed.text(n)) for n in cp.nodes_of_type(body, "field_expression")} & {"blockIdx.y", "blockIdx.z"}:
        raise NotApplicable(f"{function.name} names blockIdx.y or blockIdx.z (grid y becomes the chunk)")
    if re.search(r"\bsplit\w*\b", state.source) or \
            any(f.name == f"{function.name}{_MERGE}" for f in cp.functions(parsed)):
        raise NotApplicable(f"the source already names split..., or has a {function.name}{_MERGE} kernel")
    launches = launches_of(state, function.name, dimensions=1)
    if len(launches) != 1:
        raise NotApplicable(f"{function.name} is launched {len(launches)} times")
    site = serial_site(parsed, function)
    if len(site.loops) != 1:
        raise NotApplicable(f"{function.name} has {len(site.loops)} loops (one chunk merge per kernel)")
    loop = site.loops[0]
    if loop.scan is not None:
        raise NotApplicable(f"{function.name}'s loop is a running sum")
    if loop.online is not None or loop.welford is not None:
        raise NotApplicable(f"{function.name}'s loop rescales a sum to a running maximum or keeps Welford's triple "
                            f"(no chunk merge for them)")
    if any(n.child_by_field_name("left").type == "subscript_expression"
           for n in cp.nodes_of_type(loop.node, "assignment_expression")):
        raise NotApplicable(f"{function.name}'s loop stores to memory (a chunk may only reduce)")
    bound = squash(parsed.text(loop.node.child_by_field_name("condition"))).split("<", 1)[1].strip()
    outputs, block = _guard(parsed, body, site.row, loop.node)
    scalars, constants = launch_scalars(parsed, function, launches[0]), parse_constants(state.source)
    # else no site; a count cast in the kernel (`r < (size_t)rows`, a nest's pairs `(long long)N * HW`) is the count
    # in the plan, which computes without overflow
    plain = bound_of(bound) or re.sub(INTEGER_CAST, "", bound)
    said = (plan_value(plain, scalars, constants), plan_value(outputs, scalars, constants))
    check_fixed(parsed, body, f"{plain} {outputs}")
    listed = statements(block)
    after = tuple(listed[listed.index(loop.node) + 1:]) if loop.node in listed else ()
    if not after:
        raise NotApplicable(f"nothing after {function.name}'s loop uses what it reduced")
    if any(not any(a.start_byte <= atomic.start_byte < a.end_byte for a in after) for atomic in site.atomics):
        raise NotApplicable(f"{function.name} makes an atomic before its loop, which every chunk would make")
    return Split(site, loop, bound, outputs, after, launches[0], said)


def _guard(parsed: cp.ParsedSource, body: Node, row: str, loop: Node) -> tuple[str, Node]:
    """(N, the block the loop sits in) for `if (row >= N) return;` before a loop in the body, or a loop in the
    block of the body's last statement `if (row < N) { ... }` (no else)."""
    listed = statements(body)
    if loop.parent == body:
        for statement in listed[:listed.index(loop)]:
            if statement.type == "if_statement" and statement.child_by_field_name("alternative") is None:
                then = statements(statement.child_by_field_name("consequence"))
                bound = guard_count(parsed, statement, row, (">=", "<="))
                if bound and len(then) == 1 and squash(parsed.text(then[0])) == "return;":
                    return bound, body
        raise NotApplicable(f"no `if ({row} >= N) return;` before the loop")
    guard = listed[-1] if listed else None
    if guard is None or guard.type != "if_statement" or guard.child_by_field_name("alternative") is not None or \
            loop.parent != guard.child_by_field_name("consequence"):
        raise NotApplicable(f"the loop is neither in the kernel's body nor in its last statement, `if ({row} < N)`")
    bound = guard_count(parsed, guard, row, ("<", ">"))
    if bound is None:
        raise NotApplicable(f"the loop's guard is not `{row} < N`")
    return bound, loop.parent


def _offset(chunk: str, count: str) -> str:
    """Where a chunk's partials start, `chunk * count` in 64 bits: a product of names after the widened chunk is
    formed in 64 bits, a sum is widened before it is a factor."""
    return f"(size_t){chunk} * {count}" if "+" not in count else f"(size_t){chunk} * ((size_t){count})"


def _chunk_start(start: str) -> str:
    """Where a chunk's steps begin: its first step, or the loop's first where that comes later."""
    return "split_first" if start == "0" else f"split_first < {start} ? {start} : split_first"


def _merge_loop(loop: RowLoop, split: Split, types: dict[str, str], indent: str) -> str:
    at = f"{_offset('split', split.outputs)} + {split.site.row}"
    if loop.arg is not None:
        arg = loop.arg
        lines = [f"const {types[arg.value]} split_value = split_{arg.value}[{at}];",
                 f"const {types[arg.index]} split_index = split_{arg.index}[{at}];",
                 *pair_join(arg, "split_value", "split_index")]
    else:
        lines = [f"{acc.name} {acc.combine}= split_{acc.name}[{at}];" if acc.combine in ("+", "*") else
                 f"{acc.name} = {acc.combine}({acc.name}, split_{acc.name}[{at}]);" for acc in loop.accumulators]
    inner = "".join(f"\n{indent}    {line}" for line in lines)
    header = f"for ({loop.kind} split = 0; split < ({split.bound} + {STEPS} - 1) / {STEPS}; ++split)"
    return f"{header} {{{inner}\n{indent}}}"


def _split_plan(state: KernelState, function: cp.Function, split: Split, types: dict[str, str]):
    launch, (bound, outputs) = split.launch, split.said
    steps, chunks = _chunking(bound, outputs)
    scratch = []
    for name, kind in types.items():
        if kind not in _DTYPES:
            raise NotApplicable(f"no scratch dtype for '{name}' of type {kind}")
        scratch.append(Scratch(name=f"split_{name}", dtype=_DTYPES[kind], count=f"{chunks} * ({outputs})"))
    extra = (Arg(kind=ArgKind.SCALAR, value=steps, type="i32"),
             *(Arg(kind=ArgKind.BUFFER, name=s.name) for s in scratch))
    chunked = replace(launch, grid=(launch.grid[0], chunks, 1), args=launch.args + extra)
    merged = replace(launch, entry=f"{function.name}{_MERGE}", args=launch.args + extra)
    launches: list[Launch] = []
    for each in state.plan.launches:
        launches += [chunked, merged] if each == launch else [each]
    return replace(state.plan, launches=tuple(launches), scratch=state.plan.scratch + tuple(scratch))


def _chunking(bound: str, outputs: str) -> tuple[str, str]:
    """(split_steps, the number of chunks) as plan expressions: chunks enough for the outputs' threads to fill every
    SM once, each of MIN_STEPS at least, no more than grid y holds; one chunk at least (a grid dimension of 0
    cannot launch)."""
    steps = (f"max({MIN_STEPS}, cdiv(max({bound}, 1), {MAX_GRID_Y}), "
             f"cdiv(max({bound}, 1), cdiv(num_sms * {SM_THREADS}, max({outputs}, 1))))")
    return steps, f"cdiv(max({bound}, 1), {steps})"


def _unsplit_plan(state: KernelState, entry: str, added: int):
    """The plan without the chunk launch, and the merge's launch as the kernel's without its last `added` arguments
    (the steps and the scratch, whose buffers go too)."""
    merged = [launch for launch in state.plan.launches if launch.entry == f"{entry}{_MERGE}"]
    if len(merged) != 1:
        raise NotApplicable(f"the plan launches {entry}{_MERGE} {len(merged)} times")
    kept, dropped = merged[0].args[:-added], merged[0].args[-added:]
    if len(dropped) != added or dropped[0].kind is not ArgKind.SCALAR or \
            any(a.kind is not ArgKind.BUFFER or not a.name.startswith("split_") for a in dropped[1:]):
        raise NotApplicable(f"the plan's last arguments of {entry}{_MERGE} are not the steps and the split_ scratch")
    names = {arg.name for arg in dropped[1:]}
    whole = replace(merged[0], entry=entry, args=kept)
    launches = tuple(whole if launch == merged[0] else launch for launch in state.plan.launches
                     if launch.entry != entry)
    return replace(state.plan, launches=launches, scratch=tuple(s for s in state.plan.scratch if s.name not in names))


def _edited(data: bytes, start: int, end: int, edits: list[Edit]) -> bytes:
    """data[start:end] with `edits` (offsets into data) applied."""
    return splice(data[start:end], [e._replace(start=e.start - start, end=e.end - start) for e in edits])[0]


def _declarator(function: cp.Function, field: str) -> Node:
    """The `field` ("parameters" or "declarator", the name) of the kernel's function declarator."""
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        raise NotApplicable(f"{function.name}: no function declarator")
    return declarator.child_by_field_name(field)


def _header(parsed: cp.ParsedSource, node: Node) -> str:
    return squash(parsed.data[node.start_byte:node.child_by_field_name("body").start_byte].decode())


def _only_loop(function: cp.Function, matches) -> Node:
    loops = [n for n in cp.nodes_of_type(function.node, "for_statement") if matches(n)]
    if len(loops) != 1:
        raise NotApplicable(f"{function.name} holds {len(loops)} loops of the split form")
    return loops[0]


def _row_of(parsed: cp.ParsedSource, function: cp.Function) -> str:
    for declaration in cp.nodes_of_type(function.node, "init_declarator"):
        if "threadIdx" in parsed.text(declaration):
            return parsed.text(declaration.child_by_field_name("declarator"))
    return ""


register(UnsplitReduction())
