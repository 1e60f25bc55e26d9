"""unstage_shared: a shared-memory tile staged from global memory becomes direct global reads.

Staging copies a tile of global memory into a `__shared__` array once per block, so that the many
reads of each element hit shared memory instead of global memory:

    As[ty][tx] = (row < M && t + tx < K) ? A[row * K + t + tx] : 0.0f;   // the staging store
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];         // the reads

Backward replaces each read of the tile by the global read it stands for and removes the store, the
array and, where the tile was the function's last shared memory, the barriers that protected it:

    for (int k = 0; k < TILE; ++k) acc += ((row < M && t + k < K) ? A[row * K + t + k] : 0.0f) * Bs[k][tx];

The substitution is the staging store's index map read backwards. Each tile index of the store is a
variable v (a thread index, a staging-loop index, a local), or v + c / v - c with c invariant, and the
variables are distinct, so the tile element t was written by the thread and iteration with v = t (- c);
the global index and the guard mention no other varying value (every other thread index, staging-loop
index or local derived from one must be one of the v's), so that element holds exactly g[G(v := t)].
A read `tile[R...]` therefore equals `g[G(v := R)]` (with the guard, and the zero where the guard
fails), evaluated where the read is. Locals of the global index keep their names where they have the
same value at the read (declared before the staging, never changed, or changed only by a loop that
holds both), and are expanded into their definitions otherwise.

A site is a `__shared__` array (static, `tile[A][B]`, or dynamic, `extern __shared__ T tile[]`) of a
function such that: every use is a full-rank element access; it is written exactly once, by a plain
store `tile[E...] = g[G]` or `tile[E...] = cond ? g[G] : zero` of a global pointer g; the store is
inside loops only (no `if`, `break` or `continue`), and a `__syncthreads()` in the same block follows
it before any read, all of them after that barrier in that block (the same pass of any loop around
it); g is never written in the function, never handed to a function that could write it, and its
launch buffer is not passed twice; the index map is invertible as above; the staged value has no
side effects, and a local it is computed from reads no memory. Anything else is refused with the
reason, and so is a site whose removal would take another mechanism along (a `#pragma unroll` on the
staging loop). Where the tile's element type is not the source's, the read converts
(`static_cast<float>(...)`), as the store did.
Pointer views. A shared array may be carved into pointer views at constant offsets (a byte array of
dynamic shared memory laid out by offset constants):

    extern __shared__ __align__(16) unsigned char smem[];
    float* x_s = reinterpret_cast<float*>(smem + OFF_X);   // also `base + N` of another view, `&smem[N]`
    float* sum_s = x_s + TILE;

Each view is a site of its own: a rank-1 tile with everything above. Its bytes are its own when every
use of the array is the initializer of such a view, every offset is a compile-time constant (evaluated
over the file's constants, counted in the elements of what it offsets) and no two views start at the
same byte: a view then owns the bytes up to the next view's start, which is the layout the offsets carve
(a kernel that reaches past its view's share breaks its own layout). A view passed to a function,
reassigned, offset at run time or chosen by a condition is refused with the reason, and so is an array
whose raw shared address is taken (`__cvta_generic_to_shared`: inline asm and address arithmetic reach it
there) or that is used in any other way. Unstaging a view removes its declaration (kept where other
views are offset from it) and, where it was the array's only view, the array.

Barriers go only when nothing else could need them: no other shared memory, asm, atomics or shuffles
in the function or the helpers it calls, and no global buffer both read and written. A dynamic array's
launch keeps its shared-memory size (unused now, and harmless).

Anchor: the function, kind "declaration", key the array's (or the view's) name; the snippet holds the function as it
was, and forward puts it back once backward of that definition gives the current source (the only
restaging this simpler kernel came from). Declared: the store and the reads leave SASS (`sts`, `lds`),
and `shared_array` / `dynamic_shared` where the array was the function's last of its kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.features.mechanisms import MECHANISMS
from klineage.kernel import KernelState
from klineage.launch import ArgKind
from klineage.lineage import FeatureLevel
from klineage.transforms import register
from klineage.transforms._constants import c_expression
from klineage.transforms._edit import (
    LOAD_INTRINSICS,
    Scope,
    cast_name,
    contains,
    function_feature_names,
    is_written,
    item_span,
    operator,
    outer_parens,
    own_lines,
    params,
    splice,
    unparen,
    unwrap,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

_VARYING_BUILTIN = "threadIdx"
_INVARIANT_BUILTINS = frozenset({"blockIdx", "blockDim", "gridDim"})
_SIMPLE = re.compile(r"^(?:[A-Za-z_][\w.]*|\d[\w.]*|\([^()]*\))$")
_WRAP_FREE = frozenset({"parenthesized_expression", "subscript_argument_list", "argument_list", "init_declarator"})
_PURE = frozenset({"min", "max", "abs"})
_CASTS = frozenset({"static_cast", "reinterpret_cast", "const_cast"})
_STAGING_FEATURES = frozenset({"shared_array", "dynamic_shared"})
_BARRIER_USERS = re.compile(r"__shared__|__syncthreads|\basm\b|\batomic[A-Z]\w*|__shfl")
_FLOAT_ZERO = re.compile(r"^(?:0|0\.0*f)$", re.IGNORECASE)
_DOUBLE_ZERO = re.compile(r"^(?:0|0\.0*|0\.)$")
# Bytes of the element types a pointer view or the array it carves can have.
_ELEMENT_BYTES = {
    "char": 1, "signed char": 1, "unsigned char": 1, "int8_t": 1, "uint8_t": 1,
    "short": 2, "unsigned short": 2, "int16_t": 2, "uint16_t": 2, "__half": 2, "half": 2, "__nv_bfloat16": 2,
    "nv_bfloat16": 2, "bf16": 2,
    "int": 4, "unsigned": 4, "unsigned int": 4, "int32_t": 4, "uint32_t": 4, "float": 4, "__half2": 4, "half2": 4,
    "__nv_bfloat162": 4,
    "long long": 8, "unsigned long long": 8, "int64_t": 8, "uint64_t": 8, "double": 8, "size_t": 8, "float2": 8,
    "int2": 8, "uint2": 8,
    "float4": 16, "int4": 16, "uint4": 16, "double2": 16,
}


@dataclass
class _Plan:
    """One shared array: why it cannot be unstaged, or the edits that unstage it."""

    name: str
    function: str
    function_node: Node
    problem: str = ""
    edits: list[tuple[int, int, str]] = field(default_factory=list)
    reads: int = 0
    view: _View | None = None  # a pointer view into a shared array, rather than an array
    gone: set[str] = field(default_factory=set)  # the names whose declarations the edits remove


@dataclass
class _View:
    """A pointer into a shared array at a constant byte offset: `T* v = reinterpret_cast<T*>(smem + OFF)`."""

    root: cp.Declaration  # the __shared__ array it carves
    offset: int  # bytes from the start of the root
    base: cp.Declaration  # what its initializer offsets: the root or another view
    carved: list[cp.Declaration] = field(default_factory=list)  # the views offset from this one
    sole: bool = False  # the only view of its root


@dataclass
class _Site:
    """A plan with its anchor and, where it applies, the unstaged source and what leaves with it."""

    plan: _Plan
    anchor: Anchor
    source: str = ""
    lost: tuple[str, ...] = ()
    barriers: int = 0


class _Refused(Exception):
    """Internal: the analysis of one array stops with this reason."""


class _Analysis:
    def __init__(self, state: KernelState):
        self.state = state
        self.parsed = cp.parse(state.source)
        self.scope = Scope(self.parsed)
        self.data = self.parsed.data

    def text(self, node: Node) -> str:
        return self.parsed.text(node)

    def line(self, node: Node) -> int:
        return node.start_point.row + 1

    def source_line(self, node: Node) -> str:
        return self.parsed.source.splitlines()[node.start_point.row].strip()[:90]

    # -- the arrays ---------------------------------------------------------------------------------
    def plans(self) -> list[_Plan]:
        """A plan for each shared array, then for each pointer view into shared memory."""
        names = [f.name for f in self.scope.functions]
        found = [self._plan(d, names) for d in self.scope.declarations
                 if "__shared__" in d.specifiers and d.dims and d.function is not None]
        found += [self._plan(d, names, view=True) for d in self.scope.declarations
                  if d.function is not None and d.indirection == "*" and d.init is not None and not d.dims
                  and self.scope.memory_space(d.init) == "shared"]
        return found

    def _plan(self, declaration: cp.Declaration, names: list[str], view: bool = False) -> _Plan:
        """The staging plan of one shared array (or pointer view into shared memory), with the reason
        it is refused, if it is."""
        function_node = cp.enclosing_function(declaration.node)
        plan = _Plan(declaration.name, declaration.function, function_node)
        try:
            if names.count(declaration.function) != 1:
                raise _Refused(f"{declaration.function} is defined more than once")
            twins = [d for d in self.scope.declarations if d.name == declaration.name and d is not declaration
                     and d.function == declaration.function]
            if twins:
                raise _Refused(f"{declaration.function} declares more than one {declaration.name}")
            if view:
                plan.view = self.view(declaration)
            _Tile(self, declaration, function_node, plan).analyse()
        except (_Refused, NotApplicable) as refused:  # NotApplicable: a statement sharing its line
            plan.problem = str(refused)
        return plan

    # -- pointer views --------------------------------------------------------------------------------
    def view(self, declaration: cp.Declaration) -> _View:
        """The view a local pointer declaration makes, after checking that its shared array is used
        only through views at distinct constant offsets (so each view owns the bytes up to the next)."""
        where = f"{declaration.name} in {declaration.function}"
        found = self._carve(declaration, 0)
        root = found.root
        function = cp.enclosing_function(declaration.node)
        if "extern" in root.specifiers:
            others = [
                d
                for d in self.scope.declarations
                if d is not root
                and {"extern", "__shared__"} <= set(d.specifiers)
                and d.function in (None, root.function)
            ]
            if others:
                raise _Refused(f"{where}: dynamic shared memory is also declared as {others[0].name} "
                               f"(line {others[0].line}): it aliases {root.name}")
        views: dict[int, tuple[cp.Declaration, _View]] = {}
        for other in self.scope.declarations:
            if other.function != declaration.function or other.indirection != "*" or other.init is None:
                continue
            try:
                carved = self._carve(other, 0)
            except _Refused:
                continue
            if carved.root is root:
                views[id(other)] = (other, carved)
        for use in cp.nodes_of_type(function, "identifier"):
            if (
                self.text(use) != root.name
                or contains(root.node, use)
                or self.scope.declaration(root.name, use) is not root
            ):
                continue
            holder = next((d for d, _ in views.values() if contains(d.init, use)), None)
            if holder is None:
                raise _Refused(
                    f"{where}: {root.name} is also used at line {self.line(use)} (`{self.source_line(use)}`), "
                    "not as a view at a constant offset: that use could reach the view's bytes"
                )
        offsets: dict[int, cp.Declaration] = {}
        for other, carved in sorted(views.values(), key=lambda v: v[0].node.start_byte):
            if carved.offset in offsets:
                raise _Refused(f"{where}: {offsets[carved.offset].name} and {other.name} both start at byte "
                               f"{carved.offset} of {root.name}: they alias")
            offsets[carved.offset] = other
            if carved.base is declaration:
                found.carved.append(other)
        found.sole = len(views) == 1
        return found

    def _carve(self, declaration: cp.Declaration, depth: int) -> _View:
        where = f"{declaration.name} in {declaration.function}"
        if depth > 8:
            raise _Refused(f"{where}: views nest too deeply")
        node, offsets = unwrap(declaration.init), []
        if node.type == "binary_expression" and operator(node) == "+":
            terms, pending = [], [node]
            while pending:  # the terms of a sum `smem + OFF_A + 64 * 2`, in any order
                term = pending.pop()
                inner = unwrap(term)
                if inner.type == "binary_expression" and operator(inner) == "+":
                    pending += [inner.child_by_field_name("right"), inner.child_by_field_name("left")]
                else:
                    terms.append(term)
            bases = [t for t in terms if unwrap(t).type == "identifier" and self._carvable(unwrap(t)) is not None]
            if len(bases) == 1:
                node, offsets = unwrap(bases[0]), [t for t in terms if t is not bases[0]]
        elif node.type == "pointer_expression" and operator(node) == "&":
            inner = unparen(node.child_by_field_name("argument"))
            if (
                inner.type == "subscript_expression"
                and unwrap(inner.child_by_field_name("argument")).type == "identifier"
            ):
                listed = [n for n in inner.child_by_field_name("indices").named_children if n.type != "comment"]
                if len(listed) == 1:
                    node, offsets = unwrap(inner.child_by_field_name("argument")), [listed[0]]
        base = self._carvable(node) if node.type == "identifier" else None
        if base is None:
            raise _Refused(f"{where}: its initializer `{self.text(declaration.init)}` is not a shared array or view "
                           "plus an offset")
        if base is declaration or base.function != declaration.function and "__shared__" not in base.specifiers:
            raise _Refused(f"{where}: its initializer `{self.text(declaration.init)}` is not a view of this function")
        if "__shared__" in base.specifiers:
            if base.function != declaration.function:
                raise _Refused(f"{where}: it views {base.name}, a shared array of namespace scope")
            root, start = base, 0
        else:
            inner = self._carve(base, depth + 1)
            root, start = inner.root, inner.offset
        size = _ELEMENT_BYTES.get(" ".join(base.type.replace("const", " ").replace("volatile", " ").split()))
        if size is None:
            raise _Refused(f"{where}: the size of {base.name}'s element type {base.type} is not known")
        value = 0
        for offset in offsets:
            try:
                value += expr.evaluate_int(c_expression(self.parsed, offset), self.state.constants)
            except ExpressionError:
                raise _Refused(f"{where}: its offset `{self.text(offset)}` into {base.name} is not a compile-time "
                               "constant") from None
        return _View(root, start + value * size, base)

    def _carvable(self, node: Node) -> cp.Declaration | None:
        """The declaration of a name that a view can be carved from: a 1-D shared array or a local pointer."""
        declaration = self.scope.declaration(self.text(node), node)
        if declaration is None:
            return None
        if "__shared__" in declaration.specifiers and len(declaration.dims) == 1 and not declaration.indirection:
            return declaration
        if declaration.function is not None and declaration.indirection == "*" and declaration.init is not None \
                and not declaration.dims:
            return declaration
        return None


class _Tile:
    """The staging analysis of one shared array."""

    def __init__(self, analysis: _Analysis, declaration: cp.Declaration, function: Node, plan: _Plan):
        self.a = analysis
        self.declaration = declaration
        self.function = function
        self.plan = plan
        self.name = declaration.name
        self.rank = len(declaration.dims) if plan.view is None else 1
        self.store: Node | None = None  # the assignment
        self.region: Node | None = None  # P: the statement of the block B that holds the store
        self.reads: list[Node] = []
        self.vars: list[str] = []  # the canonical key of each tile index's variable
        self.offsets: list[tuple[str, Node | None]] = []  # ("+" | "-" | "", c) of each tile index
        self.load: Node | None = None  # the global read `g[G]` of the store
        self.pointer: Node | None = None  # g
        self.guard: Node | None = None  # the condition of a guarded store, and its value where it fails
        self.zero: Node | None = None

    def refuse(self, why: str) -> None:
        raise _Refused(f"{self.name} in {self.plan.function}: {why}")

    # -- uses ---------------------------------------------------------------------------------------
    def analyse(self) -> None:
        if "extern" in self.declaration.specifiers:
            others = [d for d in self.a.scope.declarations if d is not self.declaration
                      and {"extern", "__shared__"} <= set(d.specifiers)
                      and d.function in (None, self.declaration.function)]
            if others:
                self.refuse(f"dynamic shared memory is also declared as {others[0].name} (line {others[0].line}): "
                            "the two arrays alias")
        writes = []
        carved = self.plan.view.carved if self.plan.view is not None else []
        blockers: list[tuple[int, str]] = []  # (rank, reason) of every use that is not an element access
        for use in self._uses():
            if any(contains(view.init, use) for view in carved):
                continue  # the base of another view: its own bytes are not this view's
            access, depth = use, 0
            while access.parent is not None and access.parent.type == "subscript_expression" and \
                    access.parent.child_by_field_name("argument") == access:
                access, depth = access.parent, depth + 1
            if depth != self.rank:
                blockers.append(self._pointer_use(use, depth))
                continue
            outer = outer_parens(access)
            parent = outer.parent
            if parent is not None and parent.type == "assignment_expression" and \
                    parent.child_by_field_name("left") == outer:
                writes.append(parent)
            elif parent is not None and parent.type == "update_expression":
                writes.append(parent)
            elif parent is not None and parent.type == "pointer_expression" and operator(parent) == "&":
                self.refuse(f"its address is taken at line {self.a.line(use)}")
            else:
                self.reads.append(access)
        if blockers:
            self.refuse(min(blockers, key=lambda blocker: blocker[0])[1])
        if len(writes) != 1:
            lines = ", ".join(str(self.a.line(w)) for w in writes) or "none"
            self.refuse(f"written {len(writes)} times (lines {lines}); only a tile written by one staging store "
                        "is unstaged")
        if not self.reads:
            self.refuse("never read")
        self.store = writes[0]
        if self.store.type != "assignment_expression" or operator(self.store) != "=":
            self.refuse(f"written by `{self.a.text(self.store)}`, not by a plain store")
        self._structure()
        self._map()
        self._check_source()
        self.plan.edits = self._edits()
        self.plan.reads = len(self.reads)

    def _pointer_use(self, use: Node, depth: int) -> tuple[int, str]:
        """Why a use that is not an element access blocks unstaging, ranked: a raw shared address first,
        then a call, a pointer copy, pointer views, anything else (the first use of the best rank)."""
        line, text = self.a.line(use), self.a.source_line(use)
        outer = outer_parens(use)
        call = outer.parent.parent if outer.parent is not None and outer.parent.type == "argument_list" else None
        if depth == 0 and call is not None and call.type == "call_expression" and cast_name(call) not in _CASTS:
            if cp.call_name(call).startswith("__cvta_generic_to_shared"):
                return (0, f"its raw shared address is taken at line {line} (`{text}`): stores and reads through "
                           "computed addresses (inline asm, address arithmetic) are not followed")
            return (1, f"passed to {cp.call_name(call)}() at line {line}, which is not followed: stores and reads "
                       "in another function cannot be substituted here")
        holder = next((d for d in self.a.scope.declarations if d.init is not None and d.indirection
                       and contains(d.init, use)), None)
        if depth == 0 and holder is not None:
            views = sorted(d.name for d in self.a.scope.declarations if d.init is not None and d.indirection
                           and d.function == self.plan.function and self._carves(d))
            if holder.name not in views:
                return (2, f"copied into the pointer {holder.name} at line {line} (`{text}`): stores and reads "
                           "through it are not followed")
            return (3, f"used as a pointer at line {line}: it is carved into the pointer view(s) {', '.join(views)}, "
                       "each of which is a site of its own")
        return (4, f"used as a pointer or a row at line {line}, not as an element (`{text}`)")

    def _carves(self, declaration: cp.Declaration) -> bool:
        """The pointer declaration is a view offset (at a constant) from this array or view."""
        try:
            return self.a._carve(declaration, 0).base is self.declaration
        except _Refused:
            return False

    def _uses(self) -> list[Node]:
        inside = self.declaration.node
        return [n for n in cp.nodes_of_type(self.function, "identifier")
                if self.a.text(n) == self.name and not contains(inside, n)
                and self.a.scope.declaration(self.name, n) is self.declaration]

    # -- where the store and the reads are ----------------------------------------------------------
    def _structure(self) -> None:
        statement = self.store.parent
        if statement.type != "expression_statement":
            self.refuse(f"the store at line {self.a.line(self.store)} is part of a larger expression")
        node = statement
        while True:
            parent = node.parent
            reads_inside = any(contains(parent, r) for r in self.reads)
            if parent.type == "compound_statement":
                if reads_inside or parent.parent.type == "function_definition":
                    break
            elif parent.type == "for_statement":
                if reads_inside:
                    self.refuse("the store and the reads share a loop without a block")
            else:
                self.refuse(f"the store at line {self.a.line(self.store)} is conditional (inside "
                            f"`{parent.type.replace('_statement', '')}`): the reads could see elements it skipped")
            node = parent
        self.region = node
        jumps = cp.nodes_of_type(node, "break_statement", "continue_statement", "return_statement", "goto_statement")
        if jumps:
            self.refuse(f"the staging can skip its store (`{self.a.text(jumps[0])}` at line {self.a.line(jumps[0])})")
        block = node.parent
        siblings = [c for c in block.named_children if c.type != "comment"]
        after = siblings[siblings.index(node) + 1:]
        barrier = None
        for sibling in after:
            if _is_barrier(self.a, sibling):
                barrier = sibling
                break
            if self._mentions(sibling):
                self.refuse(f"the tile is used at line {self.a.line(sibling)} before a __syncthreads() "
                            "follows its store")
        if barrier is None:
            self.refuse("no __syncthreads() follows the staging store in its block")
        for read in self.reads:
            if not (contains(block, read) and read.start_byte > barrier.end_byte):
                self.refuse(f"the read at line {self.a.line(read)} is not after the barrier that follows "
                            "the store in the same block (it could see another pass's tile)")

    def _mentions(self, node: Node) -> bool:
        return any(self.a.text(n) == self.name for n in cp.nodes_of_type(node, "identifier"))

    # -- the index map --------------------------------------------------------------------------------
    def _map(self) -> None:
        indices, target = [], unparen(self.store.child_by_field_name("left"))
        while target.type == "subscript_expression":
            indices.insert(0, _index(target))
            target = unparen(target.child_by_field_name("argument"))
        for index in indices:
            node, sign, offset = unparen(index), "", None
            if node.type == "binary_expression" and operator(node) in ("+", "-"):
                left, right = unparen(node.child_by_field_name("left")), unparen(node.child_by_field_name("right"))
                if self._variable(left) is not None:
                    node, sign, offset = left, operator(node), right
                elif operator(node) == "+" and self._variable(right) is not None:
                    node, sign, offset = right, "+", left
            key = self._variable(node)
            if key is None:
                self.refuse(f"the tile index `{self.a.text(index)}` is not a variable (plus an offset): the "
                            "index map cannot be inverted syntactically")
            if key in self.vars:
                self.refuse(f"two tile indices are the same variable {key}: the index map is not invertible")
            self.vars.append(key)
            self.offsets.append((sign, offset))
        for _sign, offset in self.offsets:
            if offset is not None and self._varying(offset):
                self.refuse(f"the tile index offset `{self.a.text(offset)}` varies between threads")
        value = unparen(self.store.child_by_field_name("right"))
        if cp.nodes_of_type(value, "assignment_expression", "update_expression"):
            self.refuse(f"the staged value `{self.a.text(value)}` has side effects: it cannot be repeated at the reads")
        if value.type == "conditional_expression":
            self.guard = value.child_by_field_name("condition")
            self.zero = unparen(value.child_by_field_name("alternative"))
            value = unparen(value.child_by_field_name("consequence"))
            if any(n.type in ("identifier", "field_expression") and not _callee(n)
                   for n in cp.nodes_of_type(self.zero, "identifier", "field_expression")):
                self.refuse(f"the value where the guard fails, `{self.a.text(self.zero)}`, is not a constant")
        if value.type != "subscript_expression" or unparen(value.child_by_field_name("argument")).type != "identifier":
            self.refuse(f"the staged value `{self.a.text(value)}` is not a plain global read `g[...]`")
        self.load = value
        self.pointer = unparen(value.child_by_field_name("argument"))
        if self.a.scope.memory_space(self.pointer) != "global":
            self.refuse(f"{self.a.text(self.pointer)} cannot be traced to global memory")
        # Render once at the store itself: refuses what no read could substitute either.
        self._render(self.store.child_by_field_name("right"), self.store, {})

    def _variable(self, node: Node) -> str | None:
        """The canonical key of a tile index variable: `threadIdx.x` for the builtin and for a local
        that only ever holds it, `name@offset` for any other local; None for anything else."""
        node = unparen(node)
        if node.type == "field_expression":
            argument = node.child_by_field_name("argument")
            if argument is not None and self.a.text(argument) == _VARYING_BUILTIN:
                return "threadIdx." + self.a.text(node.child_by_field_name("field"))
            return None
        if node.type != "identifier":
            return None
        declaration = self.a.scope.declaration(self.a.text(node), node)
        if declaration is None or declaration.function is None or declaration.dims or declaration.indirection:
            return None
        if declaration.init is not None and not self._modifications(declaration):
            builtin = self._variable(declaration.init) if unparen(declaration.init).type == "field_expression" else None
            if builtin is not None:
                return builtin
        return f"{declaration.name}@{declaration.node.start_byte}"

    def _varying(self, node: Node) -> bool:
        """Whether an expression mentions a thread index or a local of the staging region."""
        for leaf in cp.nodes_of_type(node, "identifier", "field_expression"):
            if leaf.type == "field_expression":
                if self.a.text(leaf.child_by_field_name("argument")) == _VARYING_BUILTIN:
                    return True
                continue
            declaration = self.a.scope.declaration(self.a.text(leaf), leaf)
            if declaration is not None and declaration.function is not None and \
                    (contains(self.region, declaration.node) or
                     (declaration.init is not None and self._varying(declaration.init))):
                return True
        return False

    # -- rendering the global read at a read site -------------------------------------------------------
    def _substitution(self, read: Node) -> dict[str, str]:
        """Tile index variable -> the text that replaces it at this read."""
        indices, target = [], read
        while target.type == "subscript_expression":
            indices.insert(0, _index(target))
            target = unparen(target.child_by_field_name("argument"))
        mapping = {}
        for key, (sign, offset), index in zip(self.vars, self.offsets, indices):
            effects = cp.nodes_of_type(index, "assignment_expression", "update_expression", "call_expression")
            if effects or self._mentions(index):
                self.refuse(f"the read index `{self.a.text(index)}` at line {self.a.line(read)} has calls, side "
                            "effects or reads of the tile: it cannot be repeated in the global index")
            text = self.a.text(index).strip()
            if offset is not None:
                inverse = "-" if sign == "+" else "+"
                text = f"{_wrap(text)} {inverse} {_wrap(self._render(offset, read, {}))}"
            if offset is not None or not self._same_variable(unparen(index), key):
                mapping[key] = text
        return mapping

    def _same_variable(self, index: Node, key: str) -> bool:
        """The read index is the store's own index variable, with the same value (a thread index, or
        a local never changed): the variable then stands for itself."""
        if self._variable(index) != key:
            return False
        if key.startswith(_VARYING_BUILTIN + "."):
            return True
        declaration = self.a.scope.declaration(self.a.text(index), index)
        return declaration is not None and not self._modifications(declaration)

    def _render(self, node: Node, site: Node, mapping: dict[str, str], depth: int = 0) -> str:
        """The text of `node` (an expression of the store) as it reads at `site` with the tile
        index variables replaced by `mapping` (variables it leaves out stand for themselves)."""
        if depth > 8:
            self.refuse(f"`{self.a.text(node)}` is defined too deeply to expand")
        leaf = self._leaf(node, site, mapping, depth)
        if leaf is not None:
            return leaf
        if not node.children:
            return self.a.text(node)
        pieces, position = [], node.start_byte
        for child in node.children:
            pieces.append(self.a.data[position:child.start_byte].decode("utf-8"))
            pieces.append(self._render(child, site, mapping, depth))
            position = child.end_byte
        pieces.append(self.a.data[position:node.end_byte].decode("utf-8"))
        return "".join(pieces)

    def _leaf(self, node: Node, site: Node, mapping: dict[str, str], depth: int) -> str | None:
        if node.type == "field_expression":
            argument = node.child_by_field_name("argument")
            builtin = self.a.text(argument) if argument is not None else ""
            if builtin == _VARYING_BUILTIN:
                key = "threadIdx." + self.a.text(node.child_by_field_name("field"))
                if key not in self.vars:
                    self.refuse(f"the global index depends on {key}, which no tile index names: "
                                "the index map is not invertible")
                return _placed(mapping.get(key, key), node)
            return self.a.text(node) if builtin in _INVARIANT_BUILTINS else None
        if node.type != "identifier" or _callee(node):
            return None
        name = self.a.text(node)
        declaration = self.a.scope.declaration(name, node)
        param = self.a.scope.param(name, node)
        if declaration is not None and declaration.function is not None:
            key = self._variable(node)
            if key in self.vars:
                if key in mapping:
                    return _placed(mapping[key], node)
                self._same_at(node, site, declaration)
                return name
            return self._local(node, site, mapping, depth, declaration)
        if declaration is not None:  # namespace scope
            if "constexpr" not in declaration.specifiers and "const" not in declaration.specifiers:
                self.refuse(f"the global index reads the mutable variable {name}")
            return name
        if param is not None:
            self._same_at(node, site, None)
            if self._param_modified(name):
                self.refuse(f"the parameter {name} is assigned in {self.plan.function}")
            return name
        return name  # a macro, an enumerator, a template parameter

    def _local(self, node: Node, site: Node, mapping: dict[str, str], depth: int,
               declaration: cp.Declaration) -> str:
        name = self.a.text(node)
        if declaration.dims:
            self.refuse(f"the global index reads the local array {name}")
        inside = contains(self.region, declaration.node)
        depends = self._depends(declaration, set())
        changed = self._modifications(declaration)
        if not inside and not (depends & set(mapping)):
            # the same value at the read: declared before the staging, changed at most by a loop around both
            for change in changed:
                loop = _update_of(change)
                if loop is None or not all(contains(loop.child_by_field_name("body"), n)
                                           for n in (self.store, *self.reads)):
                    self.refuse(f"{name} changes between the store and the reads (line {self.a.line(change)})")
            self._same_at(node, site, declaration)
            return name
        if declaration.init is None or declaration.indirection or changed:
            self.refuse(f"the global index depends on {name}, which the tile index does not determine")
        if cp.nodes_of_type(declaration.init, "subscript_expression", "pointer_expression") or any(
                not cast_name(call) and cp.call_name(call) not in _PURE
                for call in cp.nodes_of_type(declaration.init, "call_expression")):
            self.refuse(f"{name} is computed from memory or a call: its value at the read is not known to be "
                        "the one at the store")
        for leaf in cp.nodes_of_type(declaration.init, "identifier"):
            inner = self.a.scope.declaration(self.a.text(leaf), leaf)
            if inner is None or inner.function is None:
                continue
            for change in self._modifications(inner):
                loop = _update_of(change)
                if loop is None or not contains(loop.child_by_field_name("body"), declaration.node):
                    self.refuse(f"{name} is computed from {inner.name}, which changes (line {self.a.line(change)})")
        return _placed(self._render(declaration.init, site, mapping, depth + 1), node)

    def _depends(self, declaration: cp.Declaration, seen: set[str]) -> set[str]:
        """The tile index variables a local is computed from (through other locals)."""
        found: set[str] = set()
        if declaration.init is None or declaration.name in seen:
            return found
        seen.add(declaration.name)
        for leaf in cp.nodes_of_type(declaration.init, "identifier", "field_expression"):
            key = self._variable(leaf)
            if key in self.vars:
                found.add(key)
            elif key is not None and key.startswith(_VARYING_BUILTIN + "."):
                self.refuse(f"{declaration.name} depends on {key}, which no tile index names: the index map is "
                            "not invertible")
            elif leaf.type == "identifier":
                inner = self.a.scope.declaration(self.a.text(leaf), leaf)
                if inner is not None and inner.function is not None:
                    found |= self._depends(inner, seen)
        return found

    def _same_at(self, node: Node, site: Node, declaration: cp.Declaration | None) -> None:
        """The name means the same variable at the read as at the store."""
        name = self.a.text(node)
        if site == self.store:
            return
        if self.a.scope.declaration(name, site) is not declaration and not (
                declaration is None and self.a.scope.declaration(name, site) is None):
            self.refuse(f"{name} names another variable at the read at line {self.a.line(site)}")
        if declaration is not None and not _visible(declaration, site):
            self.refuse(f"{name} is out of scope at the read at line {self.a.line(site)}")

    def _modifications(self, declaration: cp.Declaration) -> list[Node]:
        """Assignments, increments, address-taking and by-reference arguments of a local."""
        found = []
        for node in cp.nodes_of_type(self.function, "assignment_expression", "update_expression",
                                     "pointer_expression", "argument_list"):
            if node.type == "argument_list":
                for index, argument in enumerate(a for a in node.named_children if a.type != "comment"):
                    if self._names(argument, declaration) and self._by_reference(node.parent, index):
                        found.append(argument)
                continue
            if node.type == "pointer_expression" and operator(node) != "&":
                continue
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is not None and self._names(target, declaration):
                found.append(node)
        return found

    def _names(self, node: Node, declaration: cp.Declaration) -> bool:
        node = unparen(node)
        return node.type == "identifier" and self.a.scope.declaration(self.a.text(node), node) is declaration

    def _by_reference(self, call: Node, index: int) -> bool:
        if call is None or call.type != "call_expression":
            return False
        callee = [f.node for f in self.a.scope.functions if f.name == cp.call_name(call)]
        return any(index < len(ps) and "&" in ps[index].indirection
                   for ps in (params(self.a.parsed, f) for f in callee))

    def _param_modified(self, name: str) -> bool:
        return any(unparen(t).type == "identifier" and self.a.text(unparen(t)) == name
                   and self.a.scope.param(name, t) is not None and self.a.scope.declaration(name, t) is None
                   for node in cp.nodes_of_type(self.function, "assignment_expression", "update_expression")
                   for t in [node.child_by_field_name("left") or node.child_by_field_name("argument")]
                   if t is not None)

    # -- the global source ------------------------------------------------------------------------------
    def _check_source(self) -> None:
        pointer = self.a.text(self.pointer)
        aliases = self._aliases(pointer)
        for node in cp.nodes_of_type(self.function, "assignment_expression", "update_expression"):
            target = unparen(node.child_by_field_name("left") or node.child_by_field_name("argument"))
            if target.type in ("subscript_expression", "pointer_expression", "field_expression") and \
                    _root(self.a, target) in aliases:
                self.refuse(f"the source {pointer} is written in the kernel (line {self.a.line(node)}): "
                            "the tile holds the values from before that write")
        for call in cp.nodes_of_type(self.function, "call_expression", "gnu_asm_expression"):
            name = cp.call_name(call) if call.type == "call_expression" else "asm"
            if name in LOAD_INTRINSICS or cast_name(call):
                continue
            arguments = call.child_by_field_name("arguments") if call.type == "call_expression" else call
            if arguments is not None and {self.a.text(n) for n in cp.nodes_of_type(arguments, "identifier")} & aliases:
                self.refuse(f"the source {pointer} is passed to {name}() at line {self.a.line(call)}, "
                            "which could write it")
        entry = self.plan.function
        parameters = [p.name for p in params(self.a.parsed, self.function)]
        for launch in self.a.state.plan.launches:
            if launch.entry != entry:
                continue
            buffers = [arg.name if arg.kind is ArgKind.BUFFER else None for arg in launch.args]
            for root in aliases & set(parameters):
                index = parameters.index(root)
                if index < len(buffers) and buffers[index] is not None and buffers.count(buffers[index]) > 1:
                    self.refuse(f"the launch passes buffer {buffers[index]} to {root} and to another parameter: "
                                "writes through the other could change the tile's source")

    def _aliases(self, pointer: str) -> set[str]:
        """The pointer, the parameters it is made from, and every local pointer made from them."""
        names = {pointer}
        changed = True
        while changed:
            changed = False
            for declaration in self.a.scope.declarations:
                if declaration.function != self.plan.function or declaration.init is None:
                    continue
                mentioned = {self.a.text(n) for n in cp.nodes_of_type(declaration.init, "identifier")}
                if declaration.indirection and mentioned & names and declaration.name not in names:
                    names.add(declaration.name)
                    changed = True
                if declaration.name in names and declaration.indirection:
                    new = {m for m in mentioned if (found := self.a.scope.param(m, declaration.node)) is not None
                           and found[2].indirection} - names
                    if new:
                        names |= new
                        changed = True
        return names

    # -- the edits ------------------------------------------------------------------------------------
    def _edits(self) -> list[tuple[int, int, str]]:
        edits = []
        cast = self._cast()
        for read in self.reads:
            mapping = self._substitution(read)
            text = self._render(self.load, read, mapping)
            if self.guard is not None:
                text = f"{self._render(self.guard, read, mapping)} ? {text} : {self.a.text(self.zero)}"
                text = f"static_cast<{cast}>({text})" if cast else f"({text})"
            elif cast:
                text = f"static_cast<{cast}>({text})"
            edits.append((read.start_byte, read.end_byte, text))
        removed = self._removed_statement()
        edits.append(item_span(self.a.parsed, removed) + ("",))
        view = self.plan.view
        if view is None:
            edits.append(self._declaration_edit())
            self.plan.gone = {self.name}
        elif not view.carved:  # a view other views are offset from keeps its declaration (a pointer, no bytes)
            edits.append(self._declaration_edit())
            self.plan.gone = {self.name}
            if view.sole:  # the array had no other view: it goes too
                edits.append(_Tile(self.a, view.root, self.function, _Plan(view.root.name, self.plan.function,
                                                                           self.function))._declaration_edit())
                self.plan.gone.add(view.root.name)
        return edits

    def _cast(self) -> str:
        """The element type to convert the global read to, "" where it already has that type."""
        element = " ".join(self.declaration.type.replace("const", " ").split())
        found = self.a.scope.param(self.a.text(self.pointer), self.pointer)
        local = self.a.scope.declaration(self.a.text(self.pointer), self.pointer)
        source_type = local.type if local is not None else (found[2].type if found is not None else "")
        source_type = " ".join(source_type.replace("const", " ").split())
        if source_type != element:
            return element
        if self.zero is None:
            return ""
        zero = self.a.text(self.zero).strip()
        if element == "float" and _FLOAT_ZERO.match(zero):
            return ""
        if element == "double" and _DOUBLE_ZERO.match(zero):
            return ""
        if element not in ("float", "double") and zero == "0":
            return ""
        return element

    def _removed_statement(self) -> Node:
        """The store, or the staging loop nest around it when the nest does nothing else."""
        node = self.store.parent
        while node != self.region:
            parent = node.parent
            if parent.type == "for_statement":
                node = parent
                continue
            for child in parent.named_children:
                if child == node or child.type == "comment" or cp.pragma_text(child):
                    continue
                if child.type == "declaration" and self._private(child, parent):
                    continue
                return node
            if parent.parent is not None and parent.parent.type == "for_statement" and \
                    parent.parent.child_by_field_name("body") == parent:
                node = parent.parent
                continue
            return node
        return node

    def _private(self, declaration: Node, block: Node) -> bool:
        """A declaration whose variables are used only inside `block`."""
        names = [d for d in self.a.scope.declarations if d.node == declaration]
        for variable in names:
            for use in cp.nodes_of_type(self.function, "identifier"):
                if self.a.text(use) == variable.name and not contains(block, use) and \
                        self.a.scope.declaration(variable.name, use) is variable:
                    return False
        return bool(names)

    def _declaration_edit(self) -> tuple[int, int, str]:
        node = self.declaration.node
        declarators = node.children_by_field_name("declarator")
        if len(declarators) == 1:
            return item_span(self.a.parsed, node) + ("",)
        mine = next(d for d in declarators if self.name in {self.a.text(n) for n in cp.nodes_of_type(d, "identifier")})
        at = declarators.index(mine)
        if at + 1 < len(declarators):
            return mine.start_byte, declarators[at + 1].start_byte, ""
        return declarators[at - 1].end_byte, mine.end_byte, ""


# -- small helpers ----------------------------------------------------------------------------------------

def _index(subscript: Node) -> Node:
    indices = subscript.child_by_field_name("indices")
    listed = [n for n in indices.named_children if n.type != "comment"] if indices is not None else []
    if len(listed) != 1:
        raise _Refused(f"`{subscript.text.decode()}` is not a single-index subscript")
    return listed[0]


def _callee(node: Node) -> bool:
    parent = node.parent
    return parent is not None and (
        (parent.type == "call_expression" and parent.child_by_field_name("function") == node)
        or parent.type in ("template_function", "qualified_identifier"))


def _wrap(text: str) -> str:
    return text if _SIMPLE.match(text) else f"({text})"


def _placed(text: str, node: Node) -> str:
    """`text` standing where `node` stood: parenthesized unless it is one token or the node's
    place already delimits it."""
    parent = node.parent
    if parent is not None and parent.type in _WRAP_FREE:
        return text
    return _wrap(text)


def _update_of(change: Node) -> Node | None:
    """The for-statement whose update clause is `change`, or None."""
    parent = change.parent
    while parent is not None and parent.type in ("comma_expression", "parenthesized_expression"):
        parent = parent.parent
    if parent is not None and parent.type == "for_statement" and parent.child_by_field_name("update") is not None \
            and contains(parent.child_by_field_name("update"), change):
        return parent
    return None


def _visible(declaration: cp.Declaration, site: Node) -> bool:
    """The declaration's block (or for-statement) contains the site."""
    scope = declaration.node.parent
    return scope is not None and contains(scope, site)


def _root(analysis: _Analysis, node: Node) -> str:
    """The pointer an address expression starts from (through subscripts, casts and offsets)."""
    node = unwrap(node)
    while node.type in ("subscript_expression", "pointer_expression", "field_expression", "binary_expression"):
        if node.type == "binary_expression":
            left = unwrap(node.child_by_field_name("left"))
            node = left if left.type != "number_literal" else unwrap(node.child_by_field_name("right"))
        else:
            node = unwrap(node.child_by_field_name("argument"))
    return analysis.text(node) if node.type == "identifier" else ""


def _origins(analysis: _Analysis, name: str, function: Node) -> set[str]:
    """The pointer parameters a pointer is made from (itself when it is one, through local pointers)."""
    found, pending, seen = set(), [name], set()
    scalars = {p.name for p in params(analysis.parsed, function) if "*" not in p.indirection}
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        declaration = next((d for d in analysis.scope.declarations if d.name == current
                            and d.function == cp.function_name(function)), None)
        if declaration is None:
            found |= {current} - scalars - _INVARIANT_BUILTINS - {_VARYING_BUILTIN}
        elif declaration.init is not None:
            pending += [analysis.text(n) for n in cp.nodes_of_type(declaration.init, "identifier") if not _callee(n)]
    return found


def _is_barrier(analysis: _Analysis, node: Node) -> bool:
    if node.type != "expression_statement" or not node.named_children:
        return False
    call = unparen(node.named_children[0])
    return call.type == "call_expression" and cp.call_name(call) == "__syncthreads" and \
        not [a for a in call.child_by_field_name("arguments").named_children if a.type != "comment"]


# -- the barriers ----------------------------------------------------------------------------------------

def _barrier_edits(analysis: _Analysis, plan: _Plan) -> list[tuple[int, int, str]]:
    """The function's own `__syncthreads();` lines, where with this array gone nothing is left that
    a barrier could order; [] otherwise."""
    function = plan.function_node
    gone = plan.gone or {plan.name}
    others = [d for d in analysis.scope.declarations if "__shared__" in d.specifiers and d.name not in gone
              and d.function in (None, plan.function)]
    if others or cp.nodes_of_type(function, "gnu_asm_expression"):
        return []
    for node in cp.nodes_of_type(function, "identifier"):
        if analysis.text(node) not in gone and analysis.scope.memory_space(node) == "shared":
            return []
    if _calls_barrier_users(analysis, function) or _reads_what_it_writes(analysis, plan):
        return []
    if re.search(r"\batomic[A-Z]\w*|__shfl", analysis.text(function)):
        return []
    edits = []
    for statement in cp.nodes_of_type(function, "expression_statement"):
        if _is_barrier(analysis, statement) and statement.parent.type == "compound_statement":
            span = own_lines(analysis.parsed, statement)
            if span is not None:
                edits.append((span[0], span[1], ""))
    return edits


def _calls_barrier_users(analysis: _Analysis, function: Node) -> bool:
    """Whether the function calls, directly or through others, a function of the file with shared
    memory, barriers, asm, atomics or shuffles."""
    bodies = {f.name: f.node for f in analysis.scope.functions}
    seen, pending = set(), [function]
    while pending:
        node = pending.pop()
        for call in cp.nodes_of_type(node, "call_expression"):
            name = cp.call_name(call)
            if name in bodies and name not in seen:
                seen.add(name)
                if _BARRIER_USERS.search(analysis.text(bodies[name])):
                    return True
                pending.append(bodies[name])
    return False


def _reads_what_it_writes(analysis: _Analysis, plan: _Plan) -> bool:
    """A global buffer is both written and read in the function (threads could communicate through
    it), or the launch passes one buffer twice."""
    written, read = set(), set()
    for node in cp.nodes_of_type(plan.function_node, "subscript_expression", "pointer_expression"):
        if node.type == "pointer_expression" and operator(node) != "*":
            continue
        if analysis.scope.memory_space(node) != "global":
            continue
        (written if is_written(node) else read).update(_origins(analysis, _root(analysis, node), plan.function_node))
    if written & read:
        return True
    for launch in analysis.state.plan.launches:
        buffers = [arg.name for arg in launch.args if arg.kind is ArgKind.BUFFER]
        if launch.entry == plan.function and len(buffers) != len(set(buffers)):
            return True
    return False


# -- the transform -----------------------------------------------------------------------------------------

class UnstageShared(Transform):
    name = "unstage_shared"
    intent = ("Stage a tile of global memory in shared memory once per block (one coalesced copy, then a "
              "barrier), so that the many reads of each element hit shared memory instead of global memory.")
    role = Role.MECHANISM
    removes = ("shared_array", "dynamic_shared", "lds", "sts")
    after = ("scalarize_mma", "scalarize_ldmatrix", "unpipeline", "sync_copies")

    def find(self, state: KernelState) -> list[Anchor]:
        return [site.anchor for site in self._sites(state) if not site.plan.problem]

    def refusals(self, state: KernelState) -> list[tuple[str, str, str]]:
        """(function, array, reason) of every shared array that is not a site, for reports."""
        return [(site.plan.function, site.plan.name, site.plan.problem) for site in self._sites(state)
                if site.plan.problem]

    def _sites(self, state: KernelState) -> list[_Site]:
        """Every shared array with its unstaged source, or the reason it has none."""
        analysis = _Analysis(state)
        sites = []
        for plan in analysis.plans():
            site = _Site(plan, Anchor(plan.function, "declaration", plan.name, analysis.text(plan.function_node)))
            if not plan.problem:
                barriers = _barrier_edits(analysis, plan)
                try:
                    site.source = splice(analysis.data, plan.edits + barriers)[0].decode("utf-8")
                    site.lost = self._lost(state.source, site.source, plan.function)
                except NotApplicable as exc:
                    plan.problem = f"{plan.name} in {plan.function}: {exc}"
                site.barriers = len(barriers)
            sites.append(site)
        return sites

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        sites = [s for s in self._sites(state) if s.plan.function == anchor.function and s.plan.name == anchor.key]
        if not sites:
            raise NotApplicable(f"no shared array {anchor.key} in {anchor.function}")
        site = sites[0]
        if site.plan.problem:
            raise NotApplicable(site.plan.problem)
        barriers = f" and {site.barriers} barrier(s)" if site.barriers else ""
        view = site.plan.view
        what = "the array" if view is None else (
            "the view (its declaration stays: other views are offset from it)" if site.plan.name not in site.plan.gone
            else f"the view and the array {view.root.name} it carved" if view.root.name in site.plan.gone
            else "the view")
        return self._result(state, site.anchor, site.source, Direction.BACKWARD, site.lost,
                            f"{site.plan.name}: {site.plan.reads} read(s) became direct global reads; the staging "
                            f"store, {what}{barriers} went")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        targets = [f.node for f in cp.functions(parsed) if f.name == anchor.function]
        if len(targets) != 1 or not anchor.snippet.strip():
            raise NotApplicable(f"unstage_shared: restaging {anchor.key} needs the definition of {anchor.function} "
                                "that backward recorded in the anchor's snippet")
        target = targets[0]
        staged = splice(parsed.data, [(target.start_byte, target.end_byte, anchor.snippet)])[0].decode("utf-8")
        restored = KernelState(source=staged, plan=state.plan)
        try:
            again = self.backward(restored, anchor)
        except NotApplicable as exc:
            raise NotApplicable(f"unstage_shared: the recorded staging of {anchor.key} no longer unstages: {exc}") \
                from None
        if again.state.source != state.source:
            raise NotApplicable(f"unstage_shared: {anchor.function} is not the unstaged form of the recorded "
                                f"staging of {anchor.key} any more")
        return self._result(state, anchor, staged, Direction.FORWARD, again.removes,
                            f"{anchor.key} staged in shared memory again")

    @staticmethod
    def _lost(staged: str, unstaged: str, function: str) -> tuple[str, ...]:
        """What leaves the function: the store and the reads (SASS), and the array's source feature where
        it was the last of its kind; NotApplicable when another mechanism would go with it."""
        gone = function_feature_names(staged, function) - function_feature_names(unstaged, function)
        other = sorted(gone & MECHANISMS[FeatureLevel.SOURCE] - _STAGING_FEATURES)
        if other:
            raise NotApplicable(f"unstaging would also remove {', '.join(other)} from {function}; remove "
                                f"{'it' if len(other) == 1 else 'them'} first")
        return tuple(sorted(gone & _STAGING_FEATURES)) + ("lds", "sts")

    def _result(self, state: KernelState, anchor: Anchor, source: str, direction: Direction,
                lost: tuple[str, ...], note: str) -> Rewrite:
        if source == state.source:
            raise NotApplicable(f"{self.name} changed nothing at {anchor}")
        return Rewrite(self.name, direction, anchor, KernelState(source=source, plan=state.plan),
                       removes=lost if direction is Direction.BACKWARD else (),
                       adds=lost if direction is Direction.FORWARD else (), note=note)


register(UnstageShared())
