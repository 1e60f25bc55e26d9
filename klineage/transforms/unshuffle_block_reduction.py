"""unshuffle_block_reduction: a block reduction through warp shuffles becomes the shared-memory tree; forward
finds the tree by analysis.

The tree (the simple form, what a kernel written by hand for a block-wide sum, max or min usually holds):

    buf[t] = <value>;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];          // or = buf[t] + buf[t + s], = fmaxf(buf[t], buf[t + s]), ...
        __syncthreads();
    }

takes log2(blockDim.x) barriers, each halving the threads that work. The interleaved spelling, `for (s = 1;
s < blockDim.x; s *= 2) { if (t % (2 * s) == 0) buf[t] += buf[t + s]; __syncthreads(); }`, leaves the same
reduction in buf[0] and is read too. One tree may reduce several arrays at once (a layer norm's sum and sum of
squares: a write of each before the barrier, a combine of each under the guard); each gets its own shuffle
reduction, one after the other, and the backward writes a tree each. The forward form reduces each warp's 32
values through `__shfl_down_sync` (no barrier, no shared traffic), parks one value a warp in `buf`, and lets
the first warp reduce those the same way:

    {
        T buf_v = <value>;
        for (int buf_o = 16; buf_o > 0; buf_o >>= 1) buf_v = buf_v + __shfl_down_sync(0xffffffffu, buf_v, buf_o);
        if ((t & 31) == 0) buf[t >> 5] = buf_v;
        __syncthreads();
        if (t < 32) {
            const int buf_n = blockDim.x >> 5;
            buf_v = t < buf_n ? buf[t] : buf_v;
            for (int buf_o = 16; buf_o > 0; buf_o >>= 1) {
                T buf_w = __shfl_down_sync(0xffffffffu, buf_v, buf_o);
                if (t + buf_o < buf_n) buf_v = buf_v + buf_w;
            }
            if (t == 0) buf[0] = buf_v;
        }
        __syncthreads();
    }

Both leave the reduction of every thread's value in `buf[0]` for all threads after the last barrier; a lane of
the first warp past the warps' count combines into no lane that counts (`t + buf_o < buf_n`), so no identity
value is needed and any block of whole warps works. Only the order of the combinations changes: exact for
max, min and integer sums, a float sum rounds differently (the gate's tolerances judge it).

Legality, decided on the parse (`_trees`), conservative:
- the kernel's launches run one-dimensional blocks of a power of two of threads, 32 to 1024 (the tree halves
  `blockDim.x`, or a constant that must be half the block: otherwise it reduces another set of values);
- `buf` is a `__shared__` array of float, double, int, unsigned or long long of at least 32 elements, declared
  in the kernel, not volatile (or `extern __shared__ T buf[]`, the kernel's only one, the launch's dynamic
  shared memory holding at least 32); `t` is `threadIdx.x` or a local set to it once and never assigned;
- the statements are adjacent (comments aside); a tree is taken whole (every array it reduces qualifies); the
  loop halves its index down to 1 from half the block (`t < s`) or doubles it from 1 below the block
  (`t % (2 * s) == 0`), and its body is the guarded combines (one an array) and the barrier;
- outside the trees the kernel reads `buf` only at `[0]` and never writes it (the other slots differ after the
  forward form), no macro names it, and the kernel declares none of the names the forward form adds.

Backward writes the tree back, as `for (int buf_s = blockDim.x / 2; buf_s > 0; buf_s >>= 1)` with
`buf[t] = buf[t] <op> buf[t + buf_s]` (or the function form), from every block of the forward form; it applies
only where the forward writes this kernel again from it.

Anchor: the kernel, kind "function", key `trees`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms import register
from klineage.transforms._edit import declared_names, unassigned_locals
from klineage.transforms._naive import kernel, launches_of, readable
from klineage.transforms._warp_reduction import check_launch
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

_TYPES = r"float|double|int|unsigned int|unsigned|long long"
_SHARED = re.compile(rf"(?P<extern>extern\s+)?__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?"
                     rf"(?P<volatile>volatile\s+)?(?P<type>{_TYPES})\s+(?P<buf>\w+)\s*\[(?P<size>[^\]]*)\]\s*;")
_BYTES = {"float": 4, "int": 4, "unsigned": 4, "unsigned int": 4, "double": 8, "long long": 8}
_FUNCTIONS = ("fmaxf", "fminf", "fmax", "fmin", "max", "min")
_KEY = "trees"
_WRITE = r"\s*(?:(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--)"  # an assignment to what precedes it
_FULL = "0xffffffffu"


@dataclass(frozen=True)
class _Tree:
    start: int  # byte offsets in the source: the write of the thread's value to the end of the loop
    end: int
    buf: str
    type: str
    thread: str  # `threadIdx.x` or the local that holds it
    value: str
    op: str  # "+" or one of _FUNCTIONS
    indent: str


def _combine(op: str, left: str, right: str) -> str:
    return f"{left} + {right}" if op == "+" else f"{op}({left}, {right})"


def _view(source: str) -> str:
    """The source one character a byte (its UTF-8 read as Latin-1), so that tree-sitter's byte offsets index it
    wherever a comment holds a wider character; `_source` turns it back, byte for byte."""
    return source.encode("utf-8").decode("latin-1")


def _source(view: str) -> str:
    return view.encode("latin-1").decode("utf-8")


def _blank_comments(view: str) -> str:
    """The view with every comment turned to spaces (offsets kept), so that a comment between the tree's
    statements does not hide it."""
    data = bytearray(view.encode("latin-1"))
    for start, end in cp.comments_and_literals(bytes(data)):
        if data[start:start + 1] == b"/":
            data[start:end] = re.sub(rb"[^\n]", b" ", bytes(data[start:end]))
    return data.decode("latin-1")


def _tree_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The tree's two usual spellings: halving the threads that add (`s` from half the block down, `t < s`), or
    doubling the distance between the slots added (`s` from 1 up, `t % (2 * s) == 0`): both leave the whole
    block's reduction in buf[0]. One tree may reduce several arrays at once (a sum and a sum of squares): one
    write each before the barrier, one combine each under the guard."""
    head = (r"^(?P<indent>[ \t]*)(?=\w+\s*\[\s*(?P<t>threadIdx\.x|\w+)\s*\])"
            r"(?P<writes>(?:\w+\s*\[\s*(?P=t)\s*\]\s*=(?!=)\s*[^;{}]+?\s*;\s*)+)"
            r"__syncthreads\s*\(\s*\)\s*;\s*(?:#\s*pragma\s+unroll\b[^\n]*\n\s*)?"
            r"for\s*\(\s*(?:const\s+)?(?:unsigned\s+int|unsigned|int)\s+(?P<s>\w+)\s*=\s*")
    body = (r"\s*\)\s*\{{\s*if\s*\(\s*{guard}\s*\)\s*(?P<combine>\{{[^{{}}]*\}}|[^;{{}}]+;)\s*"
            r"__syncthreads\s*\(\s*\)\s*;\s*\}}")
    halving = (r"(?P<s0>[^;]+?)\s*;\s*(?P=s)\s*(?:>\s*0|>=\s*1|!=\s*0)\s*;\s*"
               r"(?P=s)\s*(?:>>=\s*1|/=\s*2|=\s*(?P=s)\s*(?:>>\s*1|/\s*2))"
               + body.format(guard=r"(?P=t)\s*<\s*(?P=s)"))
    twice = r"(?:2\s*\*\s*(?P=s)|(?P=s)\s*\*\s*2|(?P=s)\s*<<\s*1)"
    doubling = (r"1\s*;\s*(?P=s)\s*<\s*(?P<limit>[^;]+?)\s*;\s*"
                r"(?P=s)\s*(?:\*=\s*2|<<=\s*1|\+=\s*(?P=s)|=\s*(?P=s)\s*(?:\*\s*2|<<\s*1))"
                + body.format(guard=rf"(?:(?P=t)\s*%\s*\(\s*{twice}\s*\)\s*==\s*0"
                                    rf"|\(\s*(?P=t)\s*&\s*\(\s*{twice}\s*-\s*1\s*\)\s*\)\s*==\s*0)"))
    return re.compile(head + halving, re.M), re.compile(head + doubling, re.M)


_PATTERNS = _tree_patterns()


@dataclass(frozen=True)
class _Match:
    """One tree as written: its span, and for each array it reduces (in the order written) its start value and
    its combine statement."""

    match: re.Match[str]
    values: dict[str, str]
    combines: dict[str, str]

    @property
    def arrays(self) -> list[str]:
        return list(self.values)


def _matches(source: str, start: int, end: int) -> list[_Match]:
    """Every tree of source[start:end], each array written once before its barrier and combined once under its
    guard; a tree whose writes and combines name other arrays is none."""
    found = []
    for match in sorted((m for pattern in _PATTERNS for m in pattern.finditer(source, start, end)),
                        key=lambda m: m.start()):
        t = re.escape(match["t"])
        writes = re.findall(rf"(\w+)\s*\[\s*{t}\s*\]\s*=\s*([^;]+?)\s*;", match["writes"])
        statements = [part.strip() for part in match["combine"].strip().strip("{}").split(";") if part.strip()]
        combines = {named[0]: statement for statement in statements if (named := re.match(r"\w+", statement))}
        values = dict(writes)
        if len(values) == len(writes) == len(statements) == len(combines) and set(values) == set(combines):
            found.append(_Match(match, values, combines))
    return found


def _operator(combine: str, buf: str, t: str, s: str) -> str:
    """The reduction's operator, read from the tree's guarded statement; NotApplicable for anything else."""
    text = re.sub(r"\s+", "", combine.strip().removeprefix("{").removesuffix("}")).removesuffix(";")
    mine, partner = f"{buf}[{t}]", {f"{buf}[{t}+{s}]", f"{buf}[{s}+{t}]"}
    for other in partner:
        if text in (f"{mine}+={other}", f"{mine}={mine}+{other}", f"{mine}={other}+{mine}"):
            return "+"
        for name in _FUNCTIONS:
            if text in (f"{mine}={name}({mine},{other})", f"{mine}={name}({other},{mine})"):
                return name
    raise NotApplicable(f"{buf}'s tree combines with '{combine.strip()}', not a sum, max or min of two slots")


def _threads(state: KernelState, entry: str) -> int:
    """The block size of every launch of `entry`: one dimension of whole warps (`check_launch`), one size, a power
    of two up to 1024."""
    sizes = check_launch(state, entry)
    if len(sizes) != 1:
        raise NotApplicable(f"{entry} is launched with blocks of {sorted(sizes)} threads")
    threads = sizes.pop()
    if threads > 1024 or threads & (threads - 1):
        raise NotApplicable(f"{entry}'s block of {threads} threads is no power of two from 32 to 1024")
    return threads


def _slots(state: KernelState, function: cp.Function, body: str, shared: re.Match[str], constants: dict) -> int:
    """How many values the array holds: its declared size, or for `extern __shared__ T buf[]` the dynamic shared
    memory of the kernel's smallest launch over the type's size (the kernel's only such array: two would alias)."""
    buf, size = shared["buf"], shared["size"].strip()
    try:
        if size:
            return expr.evaluate_int(size, constants)
        if not shared["extern"]:
            raise NotApplicable(f"{buf} has no size")
        if len(re.findall(r"\bextern\s+__shared__\b", body)) > 1:
            raise NotApplicable(f"{function.name} declares more than one extern __shared__ array: they alias {buf}")
        return min(expr.evaluate_int(str(launch.shared), constants)
                   for launch in launches_of(state, function.name, dimensions=3)) // _BYTES[shared["type"]]
    except ExpressionError:
        what = size or "the dynamic shared memory of its launch"
        raise NotApplicable(f"{buf}'s size ({what}) is no constant") from None


def _thread_indexes(state: KernelState, function: cp.Function) -> set[str]:
    """threadIdx.x, and each local the kernel declares from it once (alone, or beside other locals of its
    declaration: `int row = blockIdx.x, tid = threadIdx.x;`) and never assigns."""
    parsed = cp.parse(state.source)
    node = next(f.node for f in cp.functions(parsed) if f.name == function.name)
    declared = declared_names(parsed, node)
    return {"threadIdx.x"} | {name for name, value in unassigned_locals(parsed, node).items()
                              if value == "threadIdx.x" and declared.count(name) == 1}


def _trees(state: KernelState, function: cp.Function) -> list[_Tree]:
    """The kernel's shared-memory tree reductions, each array of each tree a _Tree (in the order written), or
    NotApplicable with the reason. A tree is taken whole or not at all: every array it reduces must qualify."""
    if not function.is_kernel:
        raise NotApplicable(f"{function.name} is no kernel")
    start, end = function.node.start_byte, function.node.end_byte
    source = _blank_comments(_view(state.source))
    body = source[start:end]
    matches = _matches(source, start, end)
    constants = parse_constants(state.source)
    reasons: list[str] = []
    arrays: dict[str, re.Match[str]] = {}
    for shared in _SHARED.finditer(body):
        mine = [m for m in matches if shared["buf"] in m.values]
        if not mine:
            reasons.append(f"{shared['buf']} holds no tree reduction of the simple form")
            continue
        try:
            _check_array(state, function, body, start, shared, mine, constants)
            arrays[shared["buf"]] = shared
        except NotApplicable as error:
            reasons.append(str(error))
    threads = _threads(state, function.name) if arrays else 0
    indexes = _thread_indexes(state, function) if arrays else set()
    found: list[_Tree] = []
    for m in matches:
        if not set(m.arrays) <= set(arrays):
            continue
        try:
            found.extend(_read(m, arrays, threads, constants, indexes))
        except NotApplicable as error:
            reasons.append(str(error))
    if not found:
        none = "no __shared__ array of one dimension (the tree's)" if "__shared__" in body else "no __shared__ array"
        raise NotApplicable(f"{function.name}: " + ("; ".join(reasons) or none))
    return found


def _check_array(state: KernelState, function: cp.Function, body: str, start: int, shared: re.Match[str],
                 mine: list[_Match], constants: dict) -> None:
    """What makes `shared` an array the forward may rewrite: its kind and size, and no use outside its trees
    but a read of its slot 0."""
    buf = shared["buf"]
    if shared["volatile"]:
        raise NotApplicable(f"{buf} is volatile (a warp-synchronous tail reads it without barriers)")
    if _slots(state, function, body, shared, constants) < 32:
        raise NotApplicable(f"{buf} holds fewer than 32 values")
    if any(re.search(rf"\b{re.escape(buf)}\b", macro.body) for macro in cp.macros(state.source)):
        raise NotApplicable(f"a macro names {buf}")
    if clash := sorted(set(re.findall(rf"\b{re.escape(buf)}_[vwon]\b", body))):
        raise NotApplicable(f"{function.name} already names '{clash[0]}'")
    outside = body
    for m in sorted(mine, key=lambda m: -m.match.start()):
        first, last = m.match.start() - start, m.match.end() - start
        outside = outside[:first] + " " * (last - first) + outside[last:]
    outside = outside.replace(shared.group(0), " " * len(shared.group(0)), 1)
    for use in re.finditer(rf"\b{re.escape(buf)}\b(?P<zero>\s*\[\s*0\s*\])?(?P<write>{_WRITE})?", outside):
        before = outside[:use.start()].rstrip()
        if not use["zero"] or use["write"] or before.endswith(("++", "--", "&")):
            raise NotApplicable(f"{function.name} uses {buf} outside its tree other than by reading {buf}[0]")


def _read(m: _Match, arrays: dict[str, re.Match[str]], threads: int, constants: dict,
          indexes: set[str]) -> list[_Tree]:
    """The tree's arrays as _Trees, once its index (one of the thread's `indexes`), its bounds, its start values and
    its combines qualify."""
    t, s, first = m.match["t"], m.match["s"], m.arrays[0]
    if t not in indexes:
        raise NotApplicable(f"{first}'s tree indexes it by '{t}', not the thread's index")
    _covers_the_block(m.match, first, threads, constants)
    trees = []
    for buf, value in m.values.items():
        if any(re.search(rf"\b{re.escape(other)}\b", value) for other in m.arrays):
            # read while other warps park their sums in the tree's arrays
            raise NotApplicable(f"{buf}'s tree starts from a value that reads {', '.join(m.arrays)}")
        trees.append(_Tree(m.match.start(), m.match.end(), buf, arrays[buf]["type"], t, value.strip(),
                           _operator(m.combines[buf], buf, t, s), m.match["indent"]))
    return trees


def _covers_the_block(tree: re.Match[str], buf: str, threads: int, constants: dict) -> None:
    """The tree spans the block: it halves from blockDim.x / 2 (or half the block's threads), or doubles up to
    blockDim.x (or the block's threads); otherwise it reduces another set of slots than all of them."""
    halving = "s0" in tree.re.groupindex
    bound, spans = (tree["s0"], 2) if halving else (tree["limit"], 1)
    if bound.replace(" ", "") in (("blockDim.x/2", "blockDim.x>>1") if halving else ("blockDim.x",)):
        return
    try:
        value = expr.evaluate_int(bound, constants)
    except ExpressionError:
        raise NotApplicable(f"{buf}'s tree is bounded by '{bound}', no constant") from None
    if spans * value != threads:
        raise NotApplicable(f"{buf}'s tree is bounded by {bound}, which does not span the {threads}-thread block")


def _shuffled(tree: _Tree) -> str:
    i, b, t, ty = tree.indent, tree.buf, tree.thread, tree.type
    step = "    "
    inner, deeper = i + step, i + 2 * step
    return (f"{{\n"
            f"{inner}{ty} {b}_v = {tree.value};\n"
            f"{inner}for (int {b}_o = 16; {b}_o > 0; {b}_o >>= 1) "
            f"{b}_v = {_combine(tree.op, f'{b}_v', f'__shfl_down_sync({_FULL}, {b}_v, {b}_o)')};\n"
            f"{inner}if (({t} & 31) == 0) {b}[{t} >> 5] = {b}_v;\n"
            f"{inner}__syncthreads();\n"
            f"{inner}if ({t} < 32) {{\n"
            f"{deeper}const int {b}_n = blockDim.x >> 5;\n"
            f"{deeper}{b}_v = {t} < {b}_n ? {b}[{t}] : {b}_v;\n"
            f"{deeper}for (int {b}_o = 16; {b}_o > 0; {b}_o >>= 1) {{\n"
            f"{deeper}{step}{ty} {b}_w = __shfl_down_sync({_FULL}, {b}_v, {b}_o);\n"
            f"{deeper}{step}if ({t} + {b}_o < {b}_n) {b}_v = {_combine(tree.op, f'{b}_v', f'{b}_w')};\n"
            f"{deeper}}}\n"
            f"{deeper}if ({t} == 0) {b}[0] = {b}_v;\n"
            f"{inner}}}\n"
            f"{inner}__syncthreads();\n"
            f"{i}}}")


def _tree(tree: _Tree) -> str:
    i, b, t = tree.indent, tree.buf, tree.thread
    s = f"{b}_s"
    return (f"{b}[{t}] = {tree.value};\n"
            f"{i}__syncthreads();\n"
            f"{i}for (int {s} = blockDim.x / 2; {s} > 0; {s} >>= 1) {{\n"
            f"{i}    if ({t} < {s}) {b}[{t}] = {_combine(tree.op, f'{b}[{t}]', f'{b}[{t} + {s}]')};\n"
            f"{i}    __syncthreads();\n"
            f"{i}}}")


_OPS = "|".join(_FUNCTIONS)
# The forward form as `_shuffled` writes it, read back into a _Tree's parts.
_SHUFFLED = re.compile(
    r"^(?P<indent>[ \t]*)\{\n[ \t]*(?P<type>" + _TYPES + r") (?P<b>\w+)_v = (?P<value>[^;\n]+);\n"
    r"[ \t]*for \(int (?P=b)_o = 16; (?P=b)_o > 0; (?P=b)_o >>= 1\) (?P=b)_v = "
    r"(?:(?P=b)_v \+ __shfl_down_sync|(?P<op>" + _OPS + r")\((?P=b)_v, __shfl_down_sync)"
    r"\(0xffffffffu, (?P=b)_v, (?P=b)_o\)\)?;\n"
    r"[ \t]*if \(\((?P<t>threadIdx\.x|\w+) & 31\) == 0\) (?P=b)\[(?P=t) >> 5\] = (?P=b)_v;\n"
    r"[ \t]*__syncthreads\(\);\n[ \t]*if \((?P=t) < 32\) \{\n"
    r"[ \t]*const int (?P=b)_n = blockDim\.x >> 5;\n"
    r"[ \t]*(?P=b)_v = (?P=t) < (?P=b)_n \? (?P=b)\[(?P=t)\] : (?P=b)_v;\n"
    r"[ \t]*for \(int (?P=b)_o = 16; (?P=b)_o > 0; (?P=b)_o >>= 1\) \{\n"
    r"[ \t]*(?P=type) (?P=b)_w = __shfl_down_sync\(0xffffffffu, (?P=b)_v, (?P=b)_o\);\n"
    r"[ \t]*if \((?P=t) \+ (?P=b)_o < (?P=b)_n\) (?P=b)_v = [^;\n]+;\n[ \t]*\}\n"
    r"[ \t]*if \((?P=t) == 0\) (?P=b)\[0\] = (?P=b)_v;\n[ \t]*\}\n[ \t]*__syncthreads\(\);\n[ \t]*\}", re.M)


def _shuffled_trees(state: KernelState, function: cp.Function) -> list[_Tree]:
    found = _SHUFFLED.finditer(_view(state.source), function.node.start_byte, function.node.end_byte)
    return [_Tree(m.start(), m.end(), m["b"], m["type"], m["t"], m["value"], m["op"] or "+", m["indent"])
            for m in found]


def _spliced(source: str, trees: list[_Tree], write) -> str:
    """The source with each span the trees cover (offsets into its `_view`) written anew: the trees of one span
    (a tree of several arrays) one after the other, on lines of their own."""
    view = _view(source)
    spans: dict[tuple[int, int], list[_Tree]] = {}
    for tree in trees:
        spans.setdefault((tree.start, tree.end), []).append(tree)
    for (start, end), group in sorted(spans.items(), reverse=True):
        indent = group[0].indent
        view = view[:start + len(indent)] + f"\n{indent}".join(write(tree) for tree in group) + view[end:]
    return _source(view)


class UnshuffleBlockReduction(Transform):
    name = "unshuffle_block_reduction"
    intent = ("Reduce a block's values through warp shuffles, one shared slot a warp, instead of a shared-memory "
              "tree with a barrier at every level.")
    placement = Placement.ANALYSIS
    removes = ("shfl",)

    def find(self, state: KernelState) -> list[Anchor]:
        return [Anchor(function.name, "function", _KEY) for function in cp.functions(cp.parse(state.source))
                if function.is_kernel and _shuffled_trees(state, function)]

    def forward_sites(self, state, carrier=None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        view = _view(state.source)
        return [Anchor(function.name, "function", _KEY, _source(view[trees[0].start:trees[0].end])[:200])
                for function, trees in readable(parsed, lambda f: _trees(state, f))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        _key(anchor)
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        trees = _trees(state, function)
        return self.rewrite(state, anchor, Direction.FORWARD, _spliced(state.source, trees, _shuffled),
                            note=f"{function.name}: {len(trees)} block reduction(s) through warp shuffles")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        _key(anchor)
        function = kernel(cp.parse(state.source), anchor)
        trees = _shuffled_trees(state, function)
        if not trees:
            raise NotApplicable(f"{anchor}: {function.name} has no block reduction through warp shuffles")
        tree_form = self.rewrite(state, anchor, Direction.BACKWARD, _spliced(state.source, trees, _tree),
                                 note=f"{function.name}: {len(trees)} block reduction(s) as shared-memory trees")
        return self.comes_back(state, anchor, tree_form, f"as a tree, {function.name} would not shuffle back")


def _key(anchor: Anchor) -> None:
    if anchor.kind != "function" or anchor.key != _KEY:
        raise NotApplicable(f"unshuffle_block_reduction needs a function anchor keyed `{_KEY}`, not {anchor}")


register(UnshuffleBlockReduction())
