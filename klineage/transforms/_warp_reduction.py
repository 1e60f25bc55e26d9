"""A thread's sequential reduction given to lanes of a warp: the reading, the legality and both rewrites that
serialize_reduction (a warp per row) and serialize_column_reduction (4 lanes per column) share, each with its own
`Layout` of the warp. serialize_reduction.py describes the mechanism and its legality.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.launch import LaunchPlan
from klineage.transforms._arg_reduction import (
    FULL_MASK,
    WARP_BUTTERFLY,
    ArgBest,
    arg_best,
    chosen_best,
    held_best,
    is_pair_butterfly,
    pair_butterfly,
    pair_join,
)
from klineage.transforms._calls import MATH_CALLS, first_effect
from klineage.transforms._canonical import NARROW, canonical
from klineage.transforms._edit import (
    Edit,
    call_arguments,
    declared_names,
    indentation,
    is_written,
    outer_parens,
    own_lines,
    splice,
    summands,
    unparen,
    written_names,
)
from klineage.transforms._flatten import Shape, flattened
from klineage.transforms._index_locals import counts_inlined, folded
from klineage.transforms._naive import (
    INDEXES,
    INTEGER_CAST,
    LOOP_INDEX_TYPES,
    kernel,
    launches_of,
    parameters,
    readable,
    rescaled_grid,
    squash,
    statements,
    typed_index,
    unwrapped,
)
from klineage.transforms._nests import unnested
from klineage.transforms._online_max import OnlineMax, is_online_butterfly, online_butterfly, online_join, online_max
from klineage.transforms._packings import HALF_CALLS
from klineage.transforms._peeled_scans import unpeeled
from klineage.transforms._pointers import aliases
from klineage.transforms._scan_spellings import (
    NAN,
    SCAN_CALLS,
    SCAN_IDENTITY,
    Scan,
    check_accumulator_uses,
    check_declared_apart,
    read_scan,
    respelled,
    scan_combined,
    scan_update,
)
from klineage.transforms._sum_starts import CONVERTED, ZERO, started_at_zero
from klineage.transforms._welford import (
    Welford,
    counted,
    is_welford_butterfly,
    welford,
    welford_butterfly,
    welford_join,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

WARP = 32
LANE, SLICE, SLICE_MASK = "lane", "slice", "slice_mask"
# the types __shfl_xor_sync carries (int64_t is long on the hosts nvcc targets: an argmax's index as torch keeps it)
_SHFL_TYPES = frozenset({"float", "double", "int", "unsigned", "unsigned int", "long long", "long", "int64_t",
                         "long long int", "long int"})
_PURE_CALLS = MATH_CALLS | HALF_CALLS  # a row of __half or __nv_bfloat16 read through its conversions, summed in float
_COMBINE_CALLS = frozenset({"fmaxf", "fminf", "fmax", "fmin", "max", "min"})
# a store to an element, plain or of the element's own value updated (what `_check_arrays` allows to be read)
_STORES = frozenset({"=", "+=", "-=", "*=", "/="})
_FORBIDDEN = re.compile(r"\b(?:__syncthreads|__syncwarp|__shared__|atomic\w*|__shfl\w*|goto|while|do|break|continue|"
                        r"gridDim|cooperative_groups|printf)\b")
# the atomics a row may make once, outside its loops (`row_atomics`): one lane of the row's makes them
_ONCE_A_ROW = frozenset({"atomicAdd", "atomicMax", "atomicMin"})
_OWN_NAMES = re.compile(rf"\b(?:{LANE}|{SLICE}|{SLICE_MASK}|offset|scan_\w+|pair_\w+|block_\w+)\b")  # the forms' names
# a row's length: a name, or a product or sum of names (`cpg * hw`), or one name cast to an integer type
# (`(size_t)rows`, kept as written: the cast is the author's and changes no length a correct kernel is given),
# maybe times more names (`(long long)n * hw`: the pairs of a nest read as one loop, `_nests.py`); or a count of
# chunks (`(n + split_steps - 1) / split_steps`: unsplit_reduction's merge walks its chunks so)
_COUNT = rf"(?:{INTEGER_CAST}\(?[\w.]+\)?(?:\s*\*\s*[\w.]+)*|[\w.]+(?:\s*[*+]\s*[\w.]+)*)"
_LOOP_BOUND = rf"(?:{_COUNT}|\(\s*{_COUNT}\s*\+\s*[\w.]+\s*-\s*1\s*\)\s*/\s*[\w.]+)"
# a row loop's condition: below its bound, and maybe below a second (`i < n && i < split_first + split_steps`: a
# chunk of the row, as unsplit_reduction writes it); the index is the pattern's group 2
_BELOW = rf"\2\s*<\s*({_LOOP_BOUND})(?:\s*&&\s*\2\s*<\s*({_LOOP_BOUND}))?"
# where a row loop starts: a number, or a local every lane of the row holds alike (`split_first`; _row_loop checks)
_START = r"(\d+|[A-Za-z_]\w*)"
# a descending loop over the whole row (`for (int j = n - 1; j >= 0; --j)`): a running sum from the row's end
_REVERSE_LOOP = re.compile(rf"^for\s*\(\s*int\s+(\w+)\s*=\s*({_LOOP_BOUND})\s*-\s*1\s*;\s*\1\s*>=\s*0\s*;"
                           r"\s*(?:--\1|\1--|\1\s*-=\s*1)\s*\)")
_SERIAL_LOOP = re.compile(rf"^for\s*\(\s*({LOOP_INDEX_TYPES})\s+(\w+)\s*=\s*{_START}\s*;\s*{_BELOW}\s*;"
                          r"\s*(?:\+\+\2|\2\+\+|\2\s*\+=\s*1)\s*\)")
def _warp_scan_pattern(op: str, exclusive: bool, reverse: bool, cast: bool) -> re.Pattern:
    """`_warp_scan`'s loop, squashed: (bound, index, value, target, the cast's type where `cast`, accumulator)."""
    def written(text: str, **groups: str) -> str:  # `text` as a pattern, its placeholders (capitals) as groups
        pattern = re.escape(text)
        for placeholder, group in groups.items():
            pattern = pattern.replace(placeholder, group)
        return pattern

    identity = re.escape(SCAN_IDENTITY[op]) if op in SCAN_IDENTITY else \
        "(?:" + "|".join(map(re.escape, NAN.values())) + ")"
    column, inside = (rf"\1 - 1 - \(scan_base \+ {LANE}\)", r"\2 >= 0") if reverse else \
        (rf"scan_base \+ {LANE}", r"\2 < \1")
    scanned = (rf"^for \(int scan_base = 0; scan_base < ({_LOOP_BOUND}); scan_base \+= {WARP}\) {{ const int (\w+) = "
               rf"{column}; [\w ]+ scan_value = {identity}; if \({inside}\) scan_value = (.+?); "
               rf"for \(int offset = 1; offset < {WARP}; offset \*= 2\) {{ const [\w ]+ scan_up = __shfl_up_sync\("
               rf"0xffffffffu, scan_value, offset\); if \({LANE} >= offset\) "
               rf"{re.escape(scan_update(op, 'scan_value', 'scan_up'))} }} ")
    # the accumulator: its group, where the store names it first, and after (the cast's type a group before it)
    accumulator, named = r"(\w+)", r"\6" if cast else r"\5"
    opened, closed = (r"\(([\w ]+)\)\(", r"\)") if cast else ("", "")
    before = written(scan_combined(op, "ACC", "scan_before"), ACC=named)
    stored = (rf"const [\w ]+ scan_before = __shfl_up_sync\(0xffffffffu, scan_value, 1\); if \({inside}\) (.+?) = "
              rf"{opened}{LANE} == 0 \? {accumulator} : {before}{closed}; ") if exclusive else \
        rf"if \({inside}\) (.+?) = {opened}{written(scan_combined(op, 'ACC', 'scan_value'), ACC=accumulator)}{closed}; "
    carry = written(scan_update(op, "ACC", f"__shfl_sync(0xffffffffu, scan_value, {WARP - 1})"), ACC=named)
    return re.compile(scanned + stored + carry + " }$")


_WARP_SCANS = {(op, exclusive, reverse, cast): _warp_scan_pattern(op, exclusive, reverse, cast)
               for op in (*SCAN_IDENTITY, *sorted(SCAN_CALLS)) for exclusive in (False, True)
               for reverse in (False, True) for cast in (False, True)}
# `<<<rows, 1>>>` kernels, grid-stride loops over rows, a batch's rows on a 2-D launch and a kernel one thread runs,
# read as one thread per row
ROW_THREADS = frozenset({Shape.ONE_THREAD_BLOCKS, Shape.GRID_STRIDE_ROWS, Shape.MATRIX_ROWS, Shape.ONE_THREAD})
_ONE_TEXT = r"1(?:\.0*)?[fF]?|1\.[fF]?|1[uUlL]*"
# a product's start: a literal, or one converted to the accumulator's type (a sum's zero: `_sum_starts.ZERO`)
_ONE = re.compile(rf"^(?:{_ONE_TEXT}|{CONVERTED.format(type='|'.join(_SHFL_TYPES), value=_ONE_TEXT)})$")
_OPERATORS = frozenset({"+", "*"})  # the folds a butterfly combines with an operator: a sum and a product
# the folds each lane must start from zero: a sum, the sum an online maximum rescales, Welford's triple
_FROM_ZERO = frozenset({"+", "online_sum", "welford_count", "welford_mean", "welford_m2"})


def as_rows(state: KernelState, only: str | None = None) -> KernelState:
    """`state` as the row forwards read it: the index as the naive forms spell it, counts and offsets named by locals
    read as their value, a sum from zero, a Welford mean counted by a local, a best value held rather than read
    back, a scan's two statements (its first element in its loop), the row shapes people write as one thread per
    row, and perfect nests as one loop (in the kernel `only` where given, other kernels as written)."""
    read = held_best(chosen_best(counted(started_at_zero(folded(counts_inlined(canonical(state))), only), only), only),
                     only)
    read = unpeeled(respelled(read, only), only)
    return unnested(flattened(read, ROW_THREADS), only)


@dataclass(frozen=True)
class Layout:
    """Which lanes of a warp share a row: the warp holds `group` consecutive rows, lanes g, g + group, g + 2 * group,
    ... take row g and stride its loops by the 32 / group lanes that share it, and the shuffles that combine a row
    stay among those lanes. 1 is a warp a row; a larger group keeps consecutive rows (columns, where the loop walks
    down a matrix) in consecutive lanes, so a loop's load is `group` adjacent elements of 32 / group rows."""

    group: int

    def __post_init__(self):
        if self.group not in (1, 2, 4, 8, 16):
            raise ValueError(f"a warp shares its lanes among 1, 2, 4, 8 or 16 rows, not {self.group}")

    @property
    def sharing(self) -> int:
        """Lanes a row has: its loops' stride, the grid's growth."""
        return WARP // self.group

    @property
    def lane(self) -> str:
        return LANE if self.group == 1 else SLICE

    def index(self, kind: str = NARROW) -> str:
        """The initializer of a row index declared `kind` (int, or long long where the naive kernel's was 64-bit)."""
        warp_index = f"({dict(INDEXES)[kind]}) / {WARP}"
        return warp_index if self.group == 1 else f"{warp_index} * {self.group} + threadIdx.x % {self.group}"

    @property
    def lines(self) -> tuple[str, ...]:
        """What follows the row index: the lane's place among its row's lanes (and the mask of those lanes)."""
        if self.group == 1:
            return (f"const int {LANE} = threadIdx.x % {WARP};",)
        bits = sum(1 << (k * self.group) for k in range(self.sharing))
        return (f"const int {SLICE} = threadIdx.x % {WARP} / {self.group};",
                f"const unsigned {SLICE_MASK} = {bits:#010x}u << (threadIdx.x % {self.group});")

    @property
    def mask(self) -> str:
        return FULL_MASK if self.group == 1 else SLICE_MASK

    @property
    def butterfly(self) -> str:
        """The header of the loop over the shuffle offsets that combine a row's lanes."""
        return WARP_BUTTERFLY if self.group == 1 else f"for (int offset = 16; offset >= {self.group}; offset /= 2)"

    def loop(self) -> re.Pattern:
        """A loop header as the forward writes it: (index type, index, first column or None, bound, second bound or
        None)."""
        return re.compile(rf"^for\s*\(\s*({LOOP_INDEX_TYPES})\s+(\w+)\s*=\s*(?:{_START} \+ )?{self.lane}\s*;\s*"
                          rf"{_BELOW}\s*;\s*\2\s*\+=\s*{self.sharing}\s*\)")

    def is_butterfly(self, text: str) -> bool:
        """Whether `text` (squashed) is a butterfly `_butterfly` writes for this layout."""
        return re.match(rf"^{re.escape(self.butterfly)} (\w+) (?:[+*]= __shfl_xor_sync|= \w+\(\1, __shfl_xor_sync)\("
                        rf"{re.escape(self.mask)}, ", text) is not None

    def combine(self, acc: Accumulator, kind: str, indent: str) -> str:
        """The code after a loop that leaves every lane of a row with its accumulator `acc` (declared `kind`)
        combined: a butterfly over the row's lanes."""
        return _butterfly(acc, self)

    def is_exchange(self, text: str) -> bool:
        """Whether `text` (squashed) is a statement `combine` or `exchange` writes after the butterfly: none in a
        warp."""
        return False

    def exchange(self, names: tuple[str, ...], kinds: tuple[str, ...], join: Callable[[list[str]], list[str]],
                 indent: str) -> str:
        """The code after a butterfly that joins tuples (an arg reduction's pair, an online maximum's, Welford's
        triple; `join` writes the statements joining the given values into them) that joins the row's warps: none
        where a row's lanes are one warp."""
        return ""


ROWS = Layout(1)


@dataclass(frozen=True)
class Accumulator:
    name: str
    combine: str  # "+", "*" or the call that combines two values (fmaxf, ...)


@dataclass(frozen=True)
class RowLoop:
    node: Node
    index: str
    accumulators: tuple[Accumulator, ...]
    scan: Scan | None = None  # set when the loop is a running sum stored per element
    arg: ArgBest | None = None  # set when the loop keeps the best value and its index
    online: OnlineMax | None = None  # set when the loop keeps a running maximum and a sum rescaled to it
    welford: Welford | None = None  # set when the loop keeps Welford's count, mean and squared deviations
    start: str = "0"  # the first column (a loop with no sum may start past the value it starts from)
    kind: str = "int"  # the loop index's type, kept


@dataclass(frozen=True)
class Site:
    function: cp.Function
    row: str
    row_init: Node  # the row declaration's initializer
    row_declaration: Node
    loops: tuple[RowLoop, ...]
    types: dict[str, str]  # accumulator -> its declared type
    kind: str = NARROW  # the row index's type: int, or long long where the kernel indexed in 64 bits
    atomics: tuple[Node, ...] = ()  # `row_atomics`: the statements of the atomics a row makes once


class WarpReduction(Transform):
    """The reading, legality and rewrites of a thread's sequential reduction given to lanes of a warp, in a
    layout each transform that uses it names (its name, intent and layout)."""

    removes = ("shfl",)
    placement = Placement.ANALYSIS
    layout: Layout
    carrier: dict[str, int] = {"warp": WARP}  # the tuning value the forward's rewrite carries

    @property
    def launch_note(self) -> str:
        """How the forward changes the launch, for its rewrite's note."""
        return f"grid x{self.layout.sharing}"

    @property
    def serial_launch_note(self) -> str:
        """How the backward changes the launch, for its rewrite's note."""
        return f"grid /{self.layout.sharing}"

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(f.name, "function", row, parsed.text(f.node)[:200]) for f, row in self._warp_kernels(parsed)]

    def forward_sites(self, state: KernelState, carrier=None) -> list[Anchor]:
        state = as_rows(state)
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", site.row, parsed.text(site.loops[0].node)[:200])
                for function, site in readable(parsed, lambda f: self._serial_site(state, parsed, f))]

    # -- forward --------------------------------------------------------------------------------

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        state = as_rows(state, anchor.function)
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        site = self._serial_site(state, parsed, function)
        if site.row != anchor.key:
            raise NotApplicable(f"{anchor}: the row variable is '{site.row}'")
        data = parsed.data
        indent = indentation(data, site.row_declaration.start_byte)
        layout = self.layout
        lines = "".join(f"\n{indent}{line}" for line in layout.lines)
        edits = [Edit(site.row_init.start_byte, site.row_init.end_byte, layout.index(site.kind)),
                 Edit(site.row_declaration.end_byte, site.row_declaration.end_byte, lines)]
        for loop in site.loops:
            node = loop.node
            if loop.scan is not None:
                bound = loop.scan.count or parsed.text(node.child_by_field_name("condition")).split("<", 1)[1].strip()
                text = _warp_scan(loop, bound, site.types[loop.scan.accumulator], indentation(data, node.start_byte))
                edits.append(Edit(node.start_byte, node.end_byte, text))
                continue
            header_end = node.child_by_field_name("body").start_byte
            condition = parsed.text(node.child_by_field_name("condition"))
            first = layout.lane if loop.start == "0" else f"{loop.start} + {layout.lane}"
            edits.append(Edit(node.start_byte, header_end, f"for ({loop.kind} {loop.index} = {first}; {condition}; "
                                                           f"{loop.index} += {layout.sharing}) "))
            loop_indent = indentation(data, node.start_byte)
            joint = _joint(loop, site.types)
            if joint is not None:
                names, butterfly, join = joint
                butterflies = f"\n{loop_indent}" + butterfly(loop_indent, layout.butterfly, layout.mask) + \
                    layout.exchange(names, tuple(site.types[n] for n in names), join, loop_indent)
            else:
                butterflies = "".join(f"\n{loop_indent}{layout.combine(acc, site.types[acc.name], loop_indent)}"
                                      for acc in loop.accumulators)
            if butterflies:
                edits.append(Edit(node.end_byte, node.end_byte, butterflies))
        edits += [Edit(atomic.start_byte, atomic.start_byte, f"if ({layout.lane} == 0) ") for atomic in site.atomics]
        source = splice(data, edits)[0].decode("utf-8")
        plan = self._shared_plan(state, parsed, function, site)
        reduced = sorted(acc.name for loop in site.loops for acc in loop.accumulators)
        return self.rewrite(state, anchor, Direction.FORWARD, source, plan=plan, carrier=self.carrier,
                            note=f"{layout.sharing} lanes per {site.row} in {function.name}: {len(site.loops)} loop(s) "
                                 f"strided over lanes, {', '.join(reduced) or 'nothing'} combined by shuffles, "
                                 f"{self.launch_note}")

    def _serial_site(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> Site:
        if not function.is_kernel:
            raise NotApplicable(f"{function.name} is not a kernel")
        check_launch(state, function.name)
        body = function.node.child_by_field_name("body")
        check_declared_apart(parsed, body)
        site = serial_site(parsed, function)
        check_accumulator_uses(parsed, body, site.loops)
        constants = state.constants
        steps = [_fixed_steps(constants, parsed, loop) for loop in site.loops]
        if None not in steps and max(steps) < self.layout.sharing:  # a pooling window, a 3-tap stencil
            raise NotApplicable(f"{function.name}'s loops take at most {max(steps)} step(s), fixed in its source: "
                                f"the {self.layout.sharing} lanes a row would take have fewer elements than lanes")
        # the grid's x grows: a block's place along it is the row index's alone
        body = function.node.child_by_field_name("body")
        if [squash(parsed.text(n)) for n in cp.nodes_of_type(body, "field_expression")].count("blockIdx.x") != 1:
            raise NotApplicable(f"{function.name} names blockIdx.x beyond its row index")
        self._check_direction(parsed, site)
        return site

    def _check_direction(self, parsed: cp.ParsedSource, site: Site) -> None:
        """A warp a row suits a loop along its row and, where few rows exist, one down a column: no check."""

    def _shared_plan(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                     site: Site) -> LaunchPlan:
        """The plan of the form whose lanes share each row: the grid grown by the lanes a row takes (kept where it
        holds them already)."""
        if _holds_the_lanes(state, parsed, function, site.row, self.layout):
            return state.plan
        return rescaled_grid(state, function.name, lambda grid: f"({grid}) * {self.layout.sharing}")

    def _serial_plan(self, state: KernelState, parsed: cp.ParsedSource, function: cp.Function,
                     row: str) -> LaunchPlan:
        """The plan of the one-thread-a-row form, from the shared form's: the grid shrunk by the lanes a row took."""
        if _holds_the_lanes(state, parsed, function, row, self.layout):
            return state.plan
        return rescaled_grid(state, function.name, lambda grid: unwrapped(grid, "(", f") * {self.layout.sharing}"))

    # -- backward -------------------------------------------------------------------------------

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        body = function.node.child_by_field_name("body")
        layout = self.layout
        kind, declaration, init, row = typed_index(parsed, body, layout.index)
        if row != anchor.key:
            raise NotApplicable(f"{anchor}: the row variable is '{row}'")
        edits = [Edit(init.start_byte, init.end_byte, dict(INDEXES)[kind])]
        line = declaration
        for expected in layout.lines:
            line = line.next_named_sibling
            if line is None or squash(parsed.text(line)) != expected:
                raise NotApplicable(f"{anchor}: no `{expected}` after the row index")
            edits.append(Edit(*_line_span(parsed, line)))
        exchanges = [block for block in cp.nodes_of_type(body, "compound_statement")
                     if layout.is_exchange(squash(parsed.text(block)))]
        for node in _outer_loops(body):
            if any(_inside(node, block) for block in exchanges):  # the loop over the warps' slots goes with them
                continue
            header = squash(parsed.data[node.start_byte:node.child_by_field_name("body").start_byte].decode())
            scan = _serial_scan(squash(parsed.text(node))) if layout == ROWS else None
            if scan is not None:
                bound, index, scanned = scan
                edits.append(Edit(node.start_byte, node.end_byte,
                                  scanned.serial(index, bound, indentation(parsed.data, node.start_byte))))
                continue
            if layout.is_butterfly(squash(parsed.text(node))) or \
                    is_pair_butterfly(parsed.text(node), layout.butterfly, layout.mask) or \
                    is_online_butterfly(parsed, node, layout.butterfly, layout.mask) or \
                    is_welford_butterfly(parsed, node, layout.butterfly, layout.mask):
                edits.append(Edit(*_line_span(parsed, node)))
                continue
            match = layout.loop().match(header)
            if match is None:
                raise NotApplicable(f"{anchor}: a loop that does not stride over lanes: `{header}`")
            kind, index, start, bound, chunk = match.groups()
            below = f"{index} < {bound}" + (f" && {index} < {chunk}" if chunk else "")
            edits.append(Edit(node.start_byte, node.child_by_field_name("body").start_byte,
                              f"for ({kind} {index} = {start or 0}; {below}; ++{index}) "))
        edits += [Edit(*_line_span(parsed, block)) for block in exchanges]
        for guard in cp.nodes_of_type(body, "if_statement"):  # one lane's atomics: every thread's again
            consequence = guard.child_by_field_name("consequence")
            if squash(parsed.text(guard.child_by_field_name("condition"))) == f"({layout.lane} == 0)" and \
                    guard.child_by_field_name("alternative") is None and _is_row_atomic(consequence):
                edits.append(Edit(guard.start_byte, consequence.start_byte, ""))
        source = splice(parsed.data, edits)[0].decode("utf-8")
        plan = self._serial_plan(state, parsed, function, row)
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            note=f"one thread per {row} in {function.name}: loops serial, shuffles gone, "
                                 f"{self.serial_launch_note}")

    def _warp_kernels(self, parsed: cp.ParsedSource) -> list[tuple[cp.Function, str]]:
        found = []
        for function in cp.functions(parsed):
            body = function.node.child_by_field_name("body")
            if not function.is_kernel or body is None or self.layout.lines[0] not in squash(parsed.text(body)):
                continue
            try:
                found.append((function, typed_index(parsed, body, self.layout.index)[3]))
            except NotApplicable:
                continue
        return found

def _holds_the_lanes(state: KernelState, parsed: cp.ParsedSource, function: cp.Function, row: str,
                     layout: Layout) -> bool:
    """Whether every launch of the kernel already runs the lanes of all its rows, so that the grid stays as it is:
    the rows a number N (`if (row < N)` in the body), each launch a number of blocks of a number of threads, at
    least N x the lanes a row takes (a kernel one thread runs, read as one row on one warp: `_flatten.py`). Else the
    grid grows by the lanes a row takes, which on one row would launch 31 idle blocks a working one."""
    guards = [squash(parsed.text(s.child_by_field_name("condition"))) for s in
              statements(function.node.child_by_field_name("body")) if s.type == "if_statement"]
    rows = next((int(found[1]) for g in guards if (found := re.fullmatch(rf"\({row} < ([1-9]\d*)\)", g))), None)
    launches = [launch for launch in state.plan.launches if launch.entry == function.name]
    return rows is not None and all(
        str(launch.grid[0]).strip().isdigit() and str(launch.block[0]).strip().isdigit() and
        int(str(launch.grid[0]).strip()) * int(str(launch.block[0]).strip()) >= rows * layout.sharing
        for launch in launches)


def serial_site(parsed: cp.ParsedSource, function: cp.Function) -> Site:
    """The kernel's one thread per row (or column) and the loops that reduce along it, each legal to share among
    lanes or chunks that start from the same values (the legality serialize_reduction.py lists but the launch's)."""
    body = function.node.child_by_field_name("body")
    text = parsed.text(body)
    atomics = row_atomics(parsed, function)
    if found := _FORBIDDEN.search(_blanked(parsed, body, atomics)):
        raise NotApplicable(f"{function.name} synchronizes, shares memory or leaves loops early (`{found[0]}`)")
    if _OWN_NAMES.search(text):
        raise NotApplicable(f"{function.name} already names '{LANE}', '{SLICE}', 'offset', 'scan_...' or "
                            f"'pair_...'")
    kind, row_declaration, row_init, row = typed_index(parsed, body)
    if text.count("threadIdx") != 1:
        raise NotApplicable(f"{function.name} uses threadIdx beyond its row index")
    if (called := first_effect(parsed, body, _PURE_CALLS, atomics)) is not None:
        raise NotApplicable(f"{function.name} calls {called}, which may have effects")
    loops, updated = [], set()
    for node in cp.nodes_of_type(body, "for_statement"):
        if _within_loop(node, body):  # a column's own loop: its row loop's fold judges it (`_private_loop`)
            continue
        loop = _row_loop(parsed, function, node, row)
        names = {acc.name for acc in loop.accumulators}
        if names & updated:
            raise NotApplicable(f"an accumulator of {function.name} is reduced in two loops")
        updated |= names
        loops.append(loop)
    if not loops:
        raise NotApplicable(f"{function.name} has no loop over its row")
    types = _check_accumulators(parsed, body, loops)
    if any(loop.scan is not None and loop.scan.op in SCAN_CALLS and types[loop.scan.accumulator] not in NAN
           for loop in loops):
        raise NotApplicable(f"a running extreme of {function.name} is of no floating type (its lanes past the row's "
                            f"end contribute NaN)")
    _check_arrays(parsed, body, loops)
    return Site(function, row, row_init, row_declaration, tuple(loops), types, kind, atomics)


def _fixed_steps(constants: dict, parsed: cp.ParsedSource, loop: RowLoop) -> int | None:
    """How many steps a row loop takes where its start and bound are numbers or `constants`, the source's (`dy < 2`,
    `k < KSIZE`, a nest read as one loop: `p < 3 * 3`); None where a count the launch passes decides it."""
    condition = squash(parsed.text(loop.node.child_by_field_name("condition")))
    if "<" not in condition or "&&" in condition:  # a loop down from the row's end, or under two bounds
        return None
    try:
        bound = re.sub(INTEGER_CAST, "", condition.split("<", 1)[1]).strip()
        return expr.evaluate_int(bound, constants) - expr.evaluate_int(loop.start, constants)
    except ExpressionError:
        return None


def row_atomics(parsed: cp.ParsedSource, function: cp.Function) -> tuple[Node, ...]:
    """The statements `atomicAdd(P, v);` (or atomicMax, atomicMin) outside every loop of the kernel, their old value
    unused, each into an array parameter the kernel names nowhere else: an update a row makes once (its term of a
    loss summed over rows). Every lane that shares a row computes the same P and v outside the loops (the
    accumulators are combined by then, and no array the kernel writes is read), so the warp forms let one lane of
    the row make it and a split makes it in the merge. Any other atomic is no site."""
    body = function.node.child_by_field_name("body")
    loops = cp.nodes_of_type(body, "for_statement")
    pointers = {name for name, _, pointer in parameters(parsed, function) if pointer}
    found = []
    for call in cp.nodes_of_type(body, "call_expression"):
        if not _is_row_atomic(call.parent) or any(_inside(call, loop) for loop in loops):
            continue
        named = set(re.findall(r"[A-Za-z_]\w*", parsed.text(call_arguments(call)[0]))) & pointers
        if len(named) == 1 and len(re.findall(rf"\b{named.pop()}\b", parsed.text(body))) == 1:
            found.append(call.parent)
    return tuple(found)


def _is_row_atomic(statement: Node | None) -> bool:
    """`statement` is `atomicAdd(P, v);` (or atomicMax, atomicMin): a call of two arguments, its value unused."""
    if statement is None or statement.type != "expression_statement" or len(statement.named_children) != 1:
        return False
    call = statement.named_children[0]
    return call.type == "call_expression" and cp.call_name(call) in _ONCE_A_ROW and len(call_arguments(call)) == 2


def _blanked(parsed: cp.ParsedSource, node: Node, spans: tuple[Node, ...]) -> str:
    """The text of `node` with the text of each of `spans` (nodes inside it) blanked out."""
    data = bytearray(parsed.data[node.start_byte:node.end_byte])
    for span in spans:
        data[span.start_byte - node.start_byte:span.end_byte - node.start_byte] = b" " * (span.end_byte -
                                                                                          span.start_byte)
    return data.decode("utf-8")


def _butterfly(acc: Accumulator, layout: Layout) -> str:
    shuffled = f"__shfl_xor_sync({layout.mask}, {acc.name}, offset)"
    combined = (f"{acc.name} {acc.combine}= {shuffled}" if acc.combine in _OPERATORS else
                f"{acc.name} = {acc.combine}({acc.name}, {shuffled})")
    return f"{layout.butterfly} {combined};"


def _line_span(parsed: cp.ParsedSource, node: Node) -> tuple[int, int]:
    span = own_lines(parsed, node)
    if span is None:
        raise NotApplicable(f"`{squash(parsed.text(node))[:60]}` shares its line with other code")
    return span


def _within_loop(node: Node, body: Node) -> bool:
    """`node` sits inside another loop of `body`."""
    parent = node.parent
    while parent is not None and parent != body:
        if parent.type not in ("compound_statement", "if_statement"):
            return True
        parent = parent.parent
    return False


def _row_loop(parsed: cp.ParsedSource, function: cp.Function, node: Node, row: str) -> RowLoop:
    body = function.node.child_by_field_name("body")
    if _within_loop(node, body):
        raise NotApplicable("a loop nested in another loop")
    loop_body = node.child_by_field_name("body")
    header = squash(parsed.data[node.start_byte:loop_body.start_byte].decode())
    match = _SERIAL_LOOP.match(header)
    if match is None and (reverse := _REVERSE_LOOP.match(header)):
        loop = fold(parsed, node, reverse[1], "0", "int")
        if loop.scan is None:
            raise NotApplicable(f"a loop down from the row's end that is no running sum or product: `{header}`")
        return replace(loop, scan=replace(loop.scan, count=reverse[2]))
    if match is None:
        raise NotApplicable(f"not a unit-step loop from a constant: `{header}`")
    if not match[3].isdigit():  # a named start: the same in every lane of the row (where a chunk begins, say)
        declared = declared_names(parsed, body).count(match[3])
        if match[3] in written_names(parsed, body) or declared != (0 if match[3] in _fixed_scalars(parsed, function)
                                                                   else 1):
            raise NotApplicable(f"the loop starts at '{match[3]}', which is neither a scalar parameter nor one local, "
                                f"never assigned")
    loop = fold(parsed, node, match[2], match[3], match[1], _nonzero(parsed, function, node, row, match[4]))
    if match[5] is not None and loop.scan is not None:
        raise NotApplicable(f"a running sum over part of its row: `{header}`")
    return loop


def _nonzero(parsed: cp.ParsedSource, function: cp.Function, loop: Node, row: str, bound: str) -> frozenset[str]:
    """The scalar parameters, never assigned, that cannot be zero wherever the loop's body runs: the factors of its
    bound (`j < C`, `j < a * b`: the body runs only below a positive bound), and of the count the row's guard
    compares against where that guard keeps the loop (`if (row >= B * HW) return;` before it, or the loop inside
    `if (row < B * HW)`: a row below their product exists)."""
    body = function.node.child_by_field_name("body")
    counts = [bound]
    for statement in statements(body):
        if statement.start_byte >= loop.start_byte or statement.type != "if_statement" or \
                statement.child_by_field_name("alternative") is not None:
            continue
        condition = squash(parsed.text(statement.child_by_field_name("condition")))
        then = statements(statement.child_by_field_name("consequence"))
        returns = [squash(parsed.text(s)) for s in then] == ["return;"]
        inside = statement.start_byte <= loop.start_byte < statement.end_byte
        found = re.fullmatch(rf"\({re.escape(row)} (>=|<) (.+)\)", condition)
        if found and ((found[1] == ">=" and returns) or (found[1] == "<" and inside)):
            counts.append(found[2])
    scalars = _fixed_scalars(parsed, function)
    factors = {name for count in counts if re.fullmatch(r"\w+(?: \* \w+)*", squash(count))
               for name in squash(count).split(" * ")}
    return frozenset(factors & scalars)


def _fixed_scalars(parsed: cp.ParsedSource, function: cp.Function) -> set[str]:
    """The kernel's scalar parameters that its body never assigns: the same value in every thread."""
    body = function.node.child_by_field_name("body")
    return {name for name, _, pointer in parameters(parsed, function) if not pointer} - written_names(parsed, body)


def fold(parsed: cp.ParsedSource, node: Node, index: str, start: str, kind: str,
         nonzero: frozenset[str] = frozenset()) -> RowLoop:
    """The reduction a row loop's body folds its columns into, each column once, whichever thread takes it: an arg
    reduction, kept extremes, sums and `f(acc, e)` combines, a running sum stored per element, stores one to one
    with the column. `start`: the first column (past 0 only for folds that may take a value twice); `nonzero`:
    names that are not zero where the body runs (`one_to_one`). NotApplicable for anything else."""
    loop_body = node.child_by_field_name("body")
    header = squash(parsed.data[node.start_byte:loop_body.start_byte].decode())
    arg = arg_best(parsed, loop_body, index)
    if arg is not None:
        return RowLoop(node, index, (Accumulator(arg.value, arg.compare), Accumulator(arg.index, "index")), arg=arg,
                       start=start, kind=kind)
    online = online_max(parsed, loop_body)
    if online is not None:
        kept = (Accumulator(online.maximum, "online_max"), Accumulator(online.total, "online_sum"))
        return RowLoop(node, index, kept, online=online, start=start, kind=kind)
    triple = welford(parsed, loop_body)
    if triple is not None:
        kept = tuple(Accumulator(name, f"welford_{part}") for name, part in
                     ((triple.count, "count"), (triple.mean, "mean"), (triple.m2, "m2")))
        return RowLoop(node, index, kept, welford=triple, start=start, kind=kind)
    if any(statement.type == "if_statement" and _kept_extreme(parsed, statement) is None and
           _conditional_update(parsed, statement) is None for statement in statements(loop_body)):
        raise NotApplicable("an `if` in a row loop that is no arg reduction (a compare that takes the value and the "
                            "loop index together, alone in the loop), no kept extreme (`if (e > m) m = e;`) "
                            "and no update under a condition of the element alone (`if (mask[j]) s += x[j];`)")
    scan = read_scan(parsed, loop_body)
    if start != "0" and scan is not None:
        raise NotApplicable(f"not a unit-step loop from 0 (only an arg reduction or an extreme may start later): "
                            f"`{header}`")
    if scan is not None and kind != "int":
        raise NotApplicable(f"a running sum over a {kind} index (its chunks count in int)")
    if scan is not None:
        # `_scan`'s target: the second statement's, or the first's in an exclusive scan
        stored = statements(loop_body)[0 if scan.exclusive else 1].named_children[0].child_by_field_name("left")
        if not one_to_one(parsed, stored, index, nonzero):
            raise NotApplicable("a running sum stored where the loop index does not say one to one")
        return RowLoop(node, index, (Accumulator(scan.accumulator, scan.op),), scan)
    accumulators: dict[str, Accumulator] = {}
    in_updates: dict[str, int] = {}  # how often each accumulator is named by its own updates
    # a column's own temporaries (`float v = ...; v = fminf(v, 127.0f);`): each lane computes them for its columns;
    # only those declared before a statement are its (a name declared later may be the row's own until then)
    declared: set[str] = set()
    for statement in statements(loop_body):
        if statement.type == "declaration":
            declared |= set(declared_names(parsed, statement))
            continue
        if _private_loop(parsed, statement, declared):
            continue
        assignment = statement.named_children[0] if statement.type == "expression_statement" and \
            statement.named_children else None
        if assignment is not None and assignment.type == "assignment_expression" and \
                parsed.text(assignment.child_by_field_name("left")) in declared:
            continue
        if statement.type == "if_statement":
            accumulator = _kept_extreme(parsed, statement) or _conditional_update(parsed, statement)
        elif assignment is None or assignment.type != "assignment_expression":
            raise NotApplicable(f"a loop statement that is no store or reduction: `{squash(parsed.text(statement))}`")
        else:
            left, right = assignment.child_by_field_name("left"), assignment.child_by_field_name("right")
            operator = parsed.text(assignment.child_by_field_name("operator"))
            if left.type == "subscript_expression" and operator in _STORES:
                if not one_to_one(parsed, left, index, nonzero) and \
                        not _pair_one_to_one(parsed, left, _pair(parsed, loop_body, index), nonzero):
                    raise NotApplicable(f"a store in a row loop whose element does not move one to one with the loop "
                                        f"index (`{squash(parsed.text(left))}`): two lanes could write one element")
                continue
            accumulator = _reduction(parsed, left, operator, right)
        if accumulator is None:
            raise NotApplicable(f"not a reduction: `{squash(parsed.text(statement))}`")
        if accumulators.get(accumulator.name, accumulator) != accumulator:
            raise NotApplicable(f"'{accumulator.name}' is combined two ways in one loop")
        accumulators[accumulator.name] = accumulator
        in_updates[accumulator.name] = in_updates.get(accumulator.name, 0) + len(
            re.findall(rf"\b{accumulator.name}\b", parsed.text(statement)))
    text = parsed.text(loop_body)
    for name in accumulators:
        if len(re.findall(rf"\b{name}\b", text)) != in_updates[name]:
            raise NotApplicable(f"'{name}' is read inside its loop beyond its own update")
    # every lane starts from the accumulator's first value: a max or min takes it again harmlessly; a sum starts from
    # zero and a product from one (_check_accumulators), which every lane may take (a chunk of the row starts later)
    if start != "0" and any(acc.combine not in (*_COMBINE_CALLS, "+", "*") for acc in accumulators.values()):
        raise NotApplicable(f"not a unit-step loop from 0 (only a sum, a product, an extreme or an arg reduction may "
                            f"start later): `{header}`")
    return RowLoop(node, index, tuple(accumulators.values()), start=start, kind=kind)


def _private_loop(parsed: cp.ParsedSource, statement: Node, declared: set[str]) -> bool:
    """`statement` is a loop of a column's own work (a product's dot over k, `for (int k = 0; k < K; ++k) acc +=
    x[r * K + k] * W[n * K + k];`): it assigns only the column's temporaries declared before it in the row loop's
    body (`declared`) and names it declares itself before assigning them (none of them a temporary's name again,
    which would leave it to the scopes which one an assignment means), writes no array element or pointee and calls
    nothing with an effect, so each lane runs it for its own columns as the serial loop did. A row loop's
    accumulator it names is read beyond its update, which `fold` refuses."""
    if statement.type != "for_statement":
        return False
    own: dict[str, int] = {}  # each name the loop declares -> where it first does
    for declaration in cp.nodes_of_type(statement, "declaration"):
        for name in declared_names(parsed, declaration):
            own.setdefault(name, declaration.start_byte)
    if set(own) & declared:
        return False
    changes = cp.nodes_of_type(statement, "assignment_expression") + cp.nodes_of_type(statement, "update_expression")
    targets = [unparen(node.child_by_field_name("left") or node.child_by_field_name("argument")) for node in changes]
    return all(target.type == "identifier" and (parsed.text(target) in declared or
                                                own.get(parsed.text(target), statement.end_byte) < target.start_byte)
               for target in targets) and first_effect(parsed, statement) is None and \
        not any(cp.call_name(call).startswith("atomic") for call in cp.nodes_of_type(statement, "call_expression"))


def _joint(loop: RowLoop, types: dict[str, str]) -> tuple[tuple[str, ...], Callable[[str, str, str], str],
                                                          Callable[[list[str]], list[str]]] | None:
    """(the accumulators, the butterfly writer (indent, header, mask), the join of other values into them) of a loop
    that folds a tuple (an arg reduction's pair, an online maximum's, Welford's triple); None for other folds."""
    if loop.arg is not None:
        arg = loop.arg
        return ((arg.value, arg.index),
                lambda indent, header, mask: pair_butterfly(arg, types[arg.value], types[arg.index], indent, header,
                                                            mask),
                lambda other: pair_join(arg, *other))
    if loop.online is not None:
        online, kind = loop.online, types[loop.online.maximum]
        return ((online.maximum, online.total), partial(online_butterfly, online, kind),
                lambda other: online_join(online, kind, *other))
    if loop.welford is not None:
        triple = loop.welford
        return ((triple.count, triple.mean, triple.m2), partial(welford_butterfly, triple, types),
                lambda other: welford_join(triple, types, *other))
    return None


def _nonzero_factor(parsed: cp.ParsedSource, factor: Node, nonzero: frozenset[str]) -> bool:
    """`factor` is a nonzero integer literal or a name of `nonzero`."""
    return (factor.type == "number_literal" and re.fullmatch(r"0*[1-9]\d*[uUlL]*", parsed.text(factor)) is not None) \
        or (factor.type == "identifier" and parsed.text(factor) in nonzero)


def one_to_one(parsed: cp.ParsedSource, subscript: Node, index: str, nonzero: frozenset[str] = frozenset()) -> bool:
    """The element `subscript` names moves one to one with the loop index: exactly one of its subscript's terms
    names the index (products over sums expanded), and that term is the index, or the index times nonzero integer
    literals or names of `nonzero` (`y[row * n + j]`, `y[base - j]`, `y[2 * j + 1]`, `out[c * HW]` and
    `out[(b * C + c) * HW + s]` where HW is not zero). Then distinct
    steps of the loop name distinct elements, and lanes that take distinct steps never write one element
    (`y[j / 2]`, `y[j % 4]` or `y[j * stride]`, stride maybe 0, might)."""
    factors = _index_factors(parsed, subscript.child_by_field_name("indices").named_children[0], index)
    return factors is not None and all(_nonzero_factor(parsed, factor, nonzero) for factor in factors)


def _pair(parsed: cp.ParsedSource, loop_body: Node, index: str) -> tuple[str, str, str] | None:
    """(outer, inner, the inner count) where the loop body starts as `_nests.unnested` writes a nest read as one loop,
    `int n = t / HW; int i = t % HW;` (t the loop index); else None."""
    listed = statements(loop_body)[:2]
    found = [re.fullmatch(rf"(?:const )?[\w ]+? (\w+) = {re.escape(index)} ([/%]) (\w+|\([\w ]+(?:\*[\w ]+)*\));",
                          squash(parsed.text(node))) for node in listed if node.type == "declaration"]
    if len(found) != 2 or None in found or [m[2] for m in found] != ["/", "%"] or found[0][3] != found[1][3]:
        return None
    return found[0][1], found[1][1], found[0][3]


def _pair_one_to_one(parsed: cp.ParsedSource, subscript: Node, pair: tuple[str, str, str] | None,
                     nonzero: frozenset[str]) -> bool:
    """The element `subscript` names moves one to one with the pairs (outer, inner) of a nest read as one loop: the
    inner index is a term of its own, and the outer index's term is it times the inner count (each of the count's
    factors) and nonzero literals or names of `nonzero` (`y[(n * C + c) * HW + i]`, C not zero). The element is then
    HW * (n * G) + i + the rest, 0 <= i < HW, G not zero: distinct pairs, distinct elements."""
    if pair is None:
        return False
    outer, inner, count = pair
    expression = subscript.child_by_field_name("indices").named_children[0]
    factors = _index_factors(parsed, expression, outer)
    if _index_factors(parsed, expression, inner) != [] or not factors:
        return False
    for name in (part.strip() for part in count.strip("()").split("*")):  # the inner count's factors, each once
        counted = next((factor for factor in factors if parsed.text(factor) == name), None)
        if counted is None:
            return False
        factors.remove(counted)
    return all(_nonzero_factor(parsed, factor, nonzero) for factor in factors)


def _index_factors(parsed: cp.ParsedSource, node: Node, index: str) -> list[Node] | None:
    """The factors that multiply the loop index where `node`'s sum names it in one term, a product over sums
    expanded (`(b * C + c) * HW + s` names c times HW): [] where that term is the index itself; None where no
    term, or more than one, names it, or it enters otherwise than as a factor (`j / 2`, `j % 4`, `j * j`)."""
    named = [term for term in summands(parsed, node) if re.search(rf"\b{index}\b", parsed.text(term))]
    if len(named) != 1:
        return None
    term = named[0]
    if term.type == "identifier":
        return [] if parsed.text(term) == index else None
    if term.type != "binary_expression" or parsed.text(term.child_by_field_name("operator")) != "*":
        return None
    sides = [unparen(term.child_by_field_name(side)) for side in ("left", "right")]
    indexed = [side for side in sides if re.search(rf"\b{index}\b", parsed.text(side))]
    if len(indexed) != 1:
        return None
    inner = _index_factors(parsed, indexed[0], index)
    return None if inner is None else [*inner, sides[1 - sides.index(indexed[0])]]


def _serial_scan(text: str) -> tuple[str, str, Scan] | None:
    """(bound, index, the scan) of a loop `_warp_scan` wrote (`text` squashed), else None."""
    for (op, exclusive, reverse, cast), pattern in _WARP_SCANS.items():
        if found := pattern.match(text):
            bound, index, value, target, *converted, accumulator = found.groups()
            return bound, index, Scan(accumulator, value, target, op, exclusive, bound if reverse else "",
                                      converted[0] if cast else "")
    return None


def _warp_scan(loop: RowLoop, bound: str, kind: str, indent: str) -> str:
    """The loop as chunks of 32 columns: each lane takes one, an inclusive shuffle scan combines the chunk up to its
    lane, and the running total of the earlier chunks (the accumulator, equal in every lane) is combined with it.
    An exclusive scan stores the lane before's (the accumulator alone in lane 0)."""
    scan, index, op = loop.scan, loop.index, loop.scan.op
    # from the row's end, lane 0 takes the last column: lane l's prefix is then the columns from the end to its own
    column, inside = (f"{bound} - 1 - (scan_base + {LANE})", f"{index} >= 0") if scan.count else \
        (f"scan_base + {LANE}", f"{index} < {bound}")
    if scan.exclusive:
        chosen = f"{LANE} == 0 ? {scan.accumulator} : {scan_combined(op, scan.accumulator, 'scan_before')}"
        stored = [f"    const {kind} scan_before = __shfl_up_sync(0xffffffffu, scan_value, 1);",
                  f"    if ({inside}) {scan.target} = {scan.stored(chosen)};"]
    else:
        prefix = scan_combined(op, scan.accumulator, "scan_value")
        stored = [f"    if ({inside}) {scan.target} = {scan.stored(prefix)};"]
    lines = [f"for (int scan_base = 0; scan_base < {bound}; scan_base += {WARP}) {{",
             f"    const int {index} = {column};",
             f"    {kind} scan_value = {SCAN_IDENTITY.get(op) or NAN[kind]};",
             f"    if ({inside}) scan_value = {scan.value};",
             f"    for (int offset = 1; offset < {WARP}; offset *= 2) {{",
             f"        const {kind} scan_up = __shfl_up_sync(0xffffffffu, scan_value, offset);",
             f"        if ({LANE} >= offset) {scan_update(op, 'scan_value', 'scan_up')}",
             "    }",
             *stored,
             f"    {scan_update(op, scan.accumulator, f'__shfl_sync(0xffffffffu, scan_value, {WARP - 1})')}",
             "}"]
    return "\n".join(indent + line for line in lines)[len(indent):]


def _outer_loops(body: Node) -> list[Node]:
    """The body's for loops that no other loop holds."""
    def nested(node: Node) -> bool:
        parent = node.parent
        while parent is not None and parent != body:
            if parent.type == "for_statement":
                return True
            parent = parent.parent
        return False

    return [node for node in cp.nodes_of_type(body, "for_statement") if not nested(node)]


def _reduction(parsed: cp.ParsedSource, left: Node, operator: str, right: Node) -> Accumulator | None:
    """The accumulator an update combines into, as any of `acc += e`, `acc -= e`, `acc = acc + e`, `acc = e + acc`,
    `acc = fmaf(a, b, acc)` (a sum), `acc *= e`, `acc = acc * e`, `acc = e * acc` (a product), `acc = f(acc, e)` or
    `acc = f(e, acc)` for f of _COMBINE_CALLS, `acc = e > acc ? e : acc` (the larger: max; `<`, min); e never naming
    acc. Else None."""
    if left.type != "identifier":
        return None
    name = parsed.text(left)

    def bare(node: Node) -> bool:
        return parsed.text(unparen(node)) == name

    def free(node: Node) -> bool:
        return not re.search(rf"\b{name}\b", parsed.text(node))

    right = unparen(right)
    if operator in ("+=", "*="):  # `s += s * e` doubles s as well: no fold of the elements alone
        return Accumulator(name, operator[0]) if free(right) else None
    if operator == "-=":  # `s -= e` is `s += -e` to the bit: each lane's partial is minus its elements, summed
        return Accumulator(name, "+") if free(right) else None
    if operator != "=":
        return None
    if right.type == "binary_expression" and parsed.text(right.child_by_field_name("operator")) in _OPERATORS:
        terms = [right.child_by_field_name(side) for side in ("left", "right")]
        if any(bare(t) for t in terms) and sum(free(t) for t in terms) == 1:
            return Accumulator(name, parsed.text(right.child_by_field_name("operator")))
    if right.type == "conditional_expression" and bare(right.child_by_field_name("alternative")):
        return _extreme(parsed, unparen(right.child_by_field_name("condition")), name,
                        unparen(right.child_by_field_name("consequence")))  # `m = e > m ? e : m`
    if right.type == "call_expression":
        arguments = right.child_by_field_name("arguments").named_children
        call = cp.call_name(right)
        if call == "fmaf" and len(arguments) == 3 and bare(arguments[2]) and free(arguments[0]) and \
                free(arguments[1]):
            return Accumulator(name, "+")
        if call in _COMBINE_CALLS and len(arguments) == 2 and any(bare(a) for a in arguments) and \
                sum(free(a) for a in arguments) == 1:
            return Accumulator(name, call)
    return None


def _conditional_update(parsed: cp.ParsedSource, statement: Node) -> Accumulator | None:
    """`if (c) acc += e;` (any update `_reduction` reads, or a count `++n`, `n++`; braces or not, no else) where c
    names no accumulator: a masked sum or count. Each lane folds the elements it takes whose condition holds, the
    warp combines the partials, and the whole is the fold of every element whose condition holds. Else None."""
    consequence = statement.child_by_field_name("consequence")
    listed = statements(consequence) if consequence is not None else []
    if statement.child_by_field_name("alternative") is not None or len(listed) != 1 or \
            listed[0].type != "expression_statement" or len(listed[0].named_children) != 1:
        return None
    update = unparen(listed[0].named_children[0])
    counted = unparen(update.child_by_field_name("argument")) if update.type == "update_expression" else None
    if counted is not None and "++" in parsed.text(update) and counted.type == "identifier":
        accumulator = Accumulator(parsed.text(counted), "+")
    elif update.type == "assignment_expression":
        operator = parsed.text(update.child_by_field_name("operator"))
        accumulator = _reduction(parsed, update.child_by_field_name("left"), operator,
                                 update.child_by_field_name("right"))
    else:
        return None
    condition = parsed.text(statement.child_by_field_name("condition"))
    if accumulator is None or re.search(rf"\b{re.escape(accumulator.name)}\b", condition):
        return None
    return accumulator


def _kept_extreme(parsed: cp.ParsedSource, statement: Node) -> Accumulator | None:
    """`if (e > m) m = e;` (or `m < e`, `>=`; braces or not, no else): m keeps the largest value, combined across
    the warp by `max`; `<` the smallest, by `min`. A NaN e is never taken, as `max` never takes one, and a NaN start
    stays in every lane. Else None."""
    condition = statement.child_by_field_name("condition")
    compare = unparen(condition.child_by_field_name("value") or condition)
    consequence = statement.child_by_field_name("consequence")
    listed = statements(consequence) if consequence is not None else []
    if statement.child_by_field_name("alternative") is not None or len(listed) != 1 or \
            listed[0].type != "expression_statement" or not listed[0].named_children:
        return None
    assignment = listed[0].named_children[0]
    if assignment.type != "assignment_expression" or parsed.text(assignment.child_by_field_name("operator")) != "=" \
            or assignment.child_by_field_name("left").type != "identifier":
        return None
    name = parsed.text(assignment.child_by_field_name("left"))
    return _extreme(parsed, compare, name, unparen(assignment.child_by_field_name("right")))


def _extreme(parsed: cp.ParsedSource, compare: Node, name: str, value: Node) -> Accumulator | None:
    """The accumulator `name` when taking `value` where `compare` (of value and name) holds keeps the larger
    value (`e > m`, `m < e`: by `max`) or the smaller (by `min`); else None. The value is taken where the compare
    holds, so a NaN value is never taken."""
    if compare.type != "binary_expression":
        return None
    taken = squash(parsed.text(value))
    left, right = (squash(parsed.text(unparen(compare.child_by_field_name(side)))) for side in ("left", "right"))
    relation = parsed.text(compare.child_by_field_name("operator"))
    if re.search(rf"\b{name}\b", taken) or {left, right} != {name, taken} or relation not in ("<", "<=", ">", ">="):
        return None
    larger = (relation in (">", ">=")) == (left == taken)  # `e > m` and `m < e` keep the larger value
    return Accumulator(name, "max" if larger else "min")


def _check_accumulators(parsed: cp.ParsedSource, body: Node, loops: list[RowLoop]) -> dict[str, str]:
    """Each accumulator: a local of a shuffle type declared in the kernel body, a sum's (not a running sum's) from
    zero, assigned nowhere before its loop but in it."""
    declared = {}
    for statement in cp.nodes_of_type(body, "declaration"):
        kind = statement.child_by_field_name("type")
        for declarator in statement.children_by_field_name("declarator"):
            if declarator.type == "init_declarator":
                name = parsed.text(declarator.child_by_field_name("declarator"))
                declared[name] = (squash(parsed.text(kind)) if kind is not None else "",
                                  parsed.text(declarator.child_by_field_name("value")))
    for loop in loops:
        for acc in loop.accumulators:
            if acc.name not in declared or declared[acc.name][0] not in _SHFL_TYPES:
                raise NotApplicable(f"accumulator '{acc.name}' is no initialized local of a shuffle type")
            # a running sum may start anywhere: its lanes add their chunk's prefix to the start every lane holds
            if acc.combine in _FROM_ZERO and loop.scan is None and not ZERO.match(declared[acc.name][1].strip()):
                raise NotApplicable(f"sum '{acc.name}' does not start at zero")
            if acc.combine == "*" and loop.scan is None and not _ONE.match(declared[acc.name][1].strip()):
                raise NotApplicable(f"product '{acc.name}' does not start at one")
            if acc.combine == "index" and loop.arg.last:
                _check_last_start(declared[loop.arg.value][1], declared[acc.name][1], loop.start)
            assigned = [a for a in cp.nodes_of_type(body, "assignment_expression", "update_expression")
                        if re.fullmatch(rf"\(*{acc.name}\)*", parsed.text(a.child_by_field_name("left")
                                                                          or a.child_by_field_name("argument")))]
            # after its loop and the butterfly every lane holds the combined value, so a later update (`mean /=
            # n`) is the same in all 32; before the loop it would be counted once a lane
            if any(not _inside(a, loop.node) and a.start_byte < loop.node.end_byte for a in assigned):
                raise NotApplicable(f"'{acc.name}' is assigned before its loop")
    return {name: kind for name, (kind, _) in declared.items()}


# a start no column's value can tie with but by being the same number in the same bits (a zero has two)
_UNTIED_START = re.compile(r"^\(?-?\s*(?:INFINITY|FLT_MAX|DBL_MAX|HUGE_VALF?)\)?$")


def _check_last_start(value: str, index: str, first: str) -> None:
    """An arg reduction that keeps the last of equal values (`>=`) gives the loop's answer where its start index is
    below every column's (or equal to the first's, from an infinity): a lane's column equal to the start then wins
    the tie as in the loop (`_arg_reduction.py`). NotApplicable otherwise."""
    index, value = squash(index), squash(value)
    if re.fullmatch(r"\(?-?\d+\)?", index) and first.isdigit() and \
            (int(index.strip("()")) < int(first) or (int(index.strip("()")) == int(first) and
                                                       _UNTIED_START.match(value))):
        return
    raise NotApplicable(f"an arg reduction that keeps the last of equal values (`>=`) starts from index `{index}`, "
                        f"not a number below its first column {first}: a tie with the start could go either way")


def _check_arrays(parsed: cp.ParsedSource, body: Node, loops: list[RowLoop]) -> None:
    """Every store is a subscript (`a[...] = e`, or `a[...] *= e` ...), and an array the kernel stores to is read
    only where a lane reads back an element it wrote itself: each access to the array in a row loop, at the same
    subscript of the loop index, the loops starting at the same column (the lanes' elements are then the same in
    every loop). A local pointer into an array (`float* out = y + row * cols;`) is that array: its declaration
    is no read, an access through it is an access to the array."""
    alias = aliases(parsed, body)

    def array(name: str) -> str:
        for _ in range(len(alias) + 1):  # a pointer declared from a pointer: follow to the first
            name = alias.get(name, name)
        return name

    written = set()
    for node in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = unparen(node.child_by_field_name("left") or node.child_by_field_name("argument"))
        if target.type == "pointer_expression":
            raise NotApplicable("a store through a pointer expression")
        if target.type == "subscript_expression":
            if node.type == "update_expression":
                raise NotApplicable(f"an increment of memory: `{squash(parsed.text(node))}`")
            written.add(array(parsed.text(target.child_by_field_name("argument"))))
    for stored in written:
        names = {stored} | {local for local in alias if array(local) == stored}
        accesses = [node for node in cp.nodes_of_type(body, "subscript_expression")
                    if parsed.text(node.child_by_field_name("argument")) in names]
        declared = 2 * (len(names) - 1)  # each local's declaration names it and the pointer it starts from
        # names, not text: `x` is no use of an array x in `threadIdx.x`
        if sum(parsed.text(node) in names for node in cp.nodes_of_type(body, "identifier")) != \
                len(accesses) + declared:
            raise NotApplicable(f"'{stored}' is used as a pointer beyond its elements")
        if all(_plain_store(parsed, node) for node in accesses):
            continue
        forms = set()
        for node in accesses:
            loop = next((loop for loop in loops if _inside(node, loop.node)), None)
            if loop is None or loop.scan is not None or not one_to_one(parsed, node, loop.index):
                raise NotApplicable(f"'{stored}' is both stored to and read")
            subscript = squash(parsed.text(node.child_by_field_name("indices")))
            forms.add((loop.start, parsed.text(node.child_by_field_name("argument")),
                       re.sub(rf"\b{loop.index}\b", "@", subscript)))
        if len(forms) != 1:
            raise NotApplicable(f"'{stored}' is both stored to and read at elements other lanes may write")


def _plain_store(parsed: cp.ParsedSource, node: Node) -> bool:
    """`node` is what a plain `=` assigns (a store that reads nothing of the array)."""
    return is_written(node) and parsed.text(outer_parens(node).parent.child_by_field_name("operator")) == "="


def _inside(node: Node, ancestor: Node) -> bool:
    while node is not None:
        if node == ancestor:
            return True
        node = node.parent
    return False


def check_launch(state: KernelState, entry: str) -> set[int]:
    """Every launch of `entry` runs one-dimensional blocks of whole warps; their sizes. The grid's y and z may be the
    kernel's own (`b = blockIdx.y`, a batch): every lane of a block has the same, and the warp forms leave them as
    they are."""
    constants = parse_constants(state.source)
    sizes = set()
    for launch in launches_of(state, entry, dimensions=3):
        if any(str(extent).strip() != "1" for extent in launch.block[1:]):
            raise NotApplicable(f"{entry}'s block has more than 1 dimension")
        try:
            threads = expr.evaluate_int(str(launch.block[0]), constants)
        except ExpressionError:
            raise NotApplicable(f"{entry}'s block size {launch.block[0]} is no constant") from None
        if threads % WARP:
            raise NotApplicable(f"{entry}'s block of {threads} threads is no multiple of {WARP}")
        sizes.add(threads)
    return sizes

