"""uncoarsen: a thread that handles a fixed batch of independent items handles one item.

Thread coarsening gives each thread C work items in a small loop over a compile-time constant, so
that fewer threads each keep C loads in flight and share their index arithmetic:

    constexpr int LOAD_BATCH = 8;
    for (int i0 = threadIdx.x; i0 < S; i0 += THREADS * LOAD_BATCH) {   // the stride loop
        float v[LOAD_BATCH];                                           // one register slot per item
        for (int b = 0; b < LOAD_BATCH; ++b) {                         // phase 1: every item's load
            const int i = i0 + b * THREADS;
            if (i < S) v[b] = x[i];
        }
        for (int b = 0; b < LOAD_BATCH; ++b) {                         // phase 2: every item's store
            const int i = i0 + b * THREADS;
            if (i < S) keys[i] = f(v[b]);
        }
    }

Backward sets the factor to 1 (`LOAD_BATCH = 1`): every item loop then runs once, with its index at 0,
and each pass of the stride loop handles one item per thread. The loops stay, written over the
factor, so forward is the constant's old value again. Two shapes are recognised, and the factor must
be used in nothing else:

A. Batch in a stride loop (above). The stride loop `for (int x0 = E; x0 < N; x0 += S * C)` holds only
   the item loops and their register arrays; each item's index is `x0 + b * S` (S > 0, the same S),
   and each item loop's body is its item indices' declarations and one `if (x < N) ...` with that N.
   The items {E + m S < N} are the same for every C; a thread takes them in the same order. Where the
   launch names C, the loop must stride over the whole grid (S names gridDim.x), so that a grid that
   grows with C = 1 changes which thread takes an item and nothing else.
B. A per-thread chunk, with the launch scaled by the factor: in a kernel, each item's index is
   `(blockIdx.x * T + threadIdx.x) * C + b` or `blockIdx.x * (T * C) + b * T + threadIdx.x` (T the
   launch's block size), guarded by `if (x < n)` with n a scalar parameter of the kernel. The plan's
   grid must name C and, with C = 1, still give a thread to every item (checked over sample case
   parameters: grid * block >= n wherever the plan supports the case); the kernel outside its item
   loops writes no memory and has no barrier or return, as each thread of the wider launch runs it.

In both, the items are independent: an item loop's index is used only in its items' indices and as
the subscript of a register array of C slots (`v[b]`, the slot that carries an item from one phase
to the next); no item loop assigns a variable declared outside it (no reduction across items), has
a barrier, shuffle, vote, asm, atomic, break, return or goto, or calls a function of the file that
writes memory; and no memory an item loop writes is read by one (told apart by memory space, or as
distinct kernel buffers): items then move between threads and passes without changing any value.
Static asserts, exact divisions and vector widths over the factor are checked as tile_constant checks
them.

Anchor: "<file>", kind "declaration" (or "macro"), key `NAME:OLD->1`. No source or SASS feature
detects coarsening: the audit is the transform's own sites (a factor of 1 is no site) and the
mechanism list (nothing else may vanish). Carrier: the old factor.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.launch import ArgKind
from klineage.transforms import register
from klineage.transforms._constants import check as check_constant
from klineage.transforms._edit import Scope, cast_name, contains, is_written, operator, params, unparen, unwrap
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

_INT_LITERAL = re.compile(r"^(?P<digits>[1-9]\d*)(?P<suffix>[uUlL]*)$")
_INT_TYPES = re.compile(r"^(?:(?:un)?signed\s+)?(?:int|long|long long|short|size_t|u?int(?:8|16|32|64)_t|unsigned)$")
_KEY = re.compile(r"^(?P<name>[A-Za-z_]\w*):(?P<old>\d+)->1$")
_COLLECTIVE = re.compile(r"sync|__shfl|__ballot|__any|__all|__activemask|__match|__reduce|atomic|__barrier|"
                         r"__threadfence|grid_group|this_grid|memcpy_async|__pipeline")
_CASTS = frozenset({"static_cast", "reinterpret_cast", "const_cast"})
_ARITHMETIC = frozenset({"+", "-", "*"})
_SAMPLES = (1, 3, 31, 100, 1000, 4097, 65536, 1 << 20)
_MAX_DEPTH = 8

Form = dict[tuple[str, ...], int]  # monomial (sorted symbol names) -> integer coefficient


# -- polynomials over symbols -------------------------------------------------------------------------

def _add(a: Form, b: Form, sign: int = 1) -> Form:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + sign * value
    return {k: v for k, v in out.items() if v}


def _mul(a: Form, b: Form) -> Form:
    out: Form = {}
    for (ka, va), (kb, vb) in itertools.product(a.items(), b.items()):
        key = tuple(sorted(ka + kb))
        out[key] = out.get(key, 0) + va * vb
    return {k: v for k, v in out.items() if v}


def _symbol(name: str) -> Form:
    return {(name,): 1}


def _number(value: int) -> Form:
    return {(): value} if value else {}


# -- the factor constants -------------------------------------------------------------------------------

@dataclass
class _Factor:
    name: str
    kind: str  # "declaration" or "macro"
    value: int
    node: Node  # the declaration or the #define
    digits: tuple[int, int]


def _factors(parsed: cp.ParsedSource) -> list[_Factor]:
    """Namespace-scope integral constants set by an integer literal above 1, in source order."""
    found = []
    for declaration in cp.declarations(parsed):
        if declaration.function is not None or declaration.init is None or declaration.indirection \
                or declaration.dims or not declaration.constant or not _INT_TYPES.match(declaration.type):
            continue
        literal = declaration.init
        match = _INT_LITERAL.match(parsed.text(literal)) if literal.type == "number_literal" else None
        if match is not None and int(match["digits"]) > 1:
            start = literal.start_byte
            found.append(_Factor(declaration.name, "declaration", int(match["digits"]), declaration.node,
                                 (start, start + len(match["digits"]))))
    for macro in cp.macros(parsed):
        value = macro.node.child_by_field_name("value")
        if macro.params is not None or value is None:
            continue
        text = parsed.text(value)
        match = _INT_LITERAL.match(text.strip())
        if match is not None and int(match["digits"]) > 1:
            start = value.start_byte + (len(text) - len(text.lstrip()))
            found.append(_Factor(macro.name, "macro", int(match["digits"]), macro.node,
                                 (start, start + len(match["digits"]))))
    return found


class _Refused(Exception):
    """Internal: the analysis of one factor stops with this reason."""


@dataclass
class _ItemLoop:
    loop: Node  # the for_statement
    index: cp.Declaration  # b
    shape: str = ""  # "batch" (A) or "chunk" (B)
    items: list[cp.Declaration] = field(default_factory=list)  # the item indices declared in its body
    guard: tuple[str, int] | None = None  # chunk: (kernel, index of the item count parameter)


@dataclass
class _Site:
    factor: _Factor
    anchor: Anchor
    problem: str = ""
    loops: list[_ItemLoop] = field(default_factory=list)


class _Analysis:
    """Whether one factor constant is a coarsening factor (see the module docstring)."""

    def __init__(self, state: KernelState, parsed: cp.ParsedSource, scope: Scope, factor: _Factor):
        self.state = state
        self.parsed = parsed
        self.scope = scope
        self.factor = factor
        self.name = factor.name
        self.constants = {k: v for k, v in state.constants.items() if isinstance(v, int) and k != self.name}
        self.loops: list[_ItemLoop] = []
        self.arrays: list[cp.Declaration] = []
        self.strides: dict[int, Node] = {}  # id of a stride loop -> the loop
        self.bases: list[tuple[cp.Declaration, Node]] = []  # a stride loop's variable, and its body
        self.chunk_bases: list[cp.Declaration] = []  # locals computed from the factor: item indices' parts
        self.kernels = {f.name for f in scope.functions if f.is_kernel}

    # -- helpers ------------------------------------------------------------------------------------
    def text(self, node: Node) -> str:
        return self.parsed.text(node)

    def line(self, node: Node) -> int:
        return node.start_point.row + 1

    def refuse(self, why: str) -> None:
        raise _Refused(f"{self.name}: {why}")

    def where(self, node: Node) -> str:
        function = cp.function_of(node)
        return f"line {self.line(node)}" + (f" of {function}" if function else "")

    def declaration_of(self, node: Node) -> cp.Declaration | None:
        return self.scope.declaration(self.text(node), node)

    def modified(self, declaration: cp.Declaration, within: Node) -> list[Node]:
        """Assignments, increments and address-taking of a variable inside `within`."""
        found = []
        for node in cp.nodes_of_type(within, "assignment_expression", "update_expression", "pointer_expression"):
            if node.type == "pointer_expression" and operator(node) != "&":
                continue
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            while target is not None and target.type in ("subscript_expression", "field_expression") \
                    and node.type == "pointer_expression":
                target = target.child_by_field_name("argument")
            target = unparen(target) if target is not None else None
            if target is not None and target.type == "identifier" and self.declaration_of(target) is declaration:
                found.append(node)
        return found

    # -- the uses of the factor --------------------------------------------------------------------------
    def analyse(self) -> None:
        uses = self._uses()
        if not uses:
            self.refuse("is never used")
        for use in uses:
            self._classify(use)
        if not self.loops:
            self.refuse("bounds no loop `for (int b = 0; b < ...; ++b)`")
        for array in self.arrays:
            self._check_array(array)
        for loop in self.loops:
            self._check_loop(loop)
        self._check_bases()
        chunks = [loop for loop in self.loops if loop.shape == "chunk"]
        if chunks:
            self._check_launch(chunks)
        self._check_memory()

    def _uses(self) -> list[Node]:
        found = []
        for node in cp.nodes_of_type(self.parsed.root, "identifier", "type_identifier"):
            if self.text(node) != self.name or contains(self.factor.node, node):
                continue
            found.append(node)
        for macro in cp.macros(self.parsed):
            if macro.name != self.name and re.search(rf"\b{re.escape(self.name)}\b", macro.body):
                self.refuse(f"the macro {macro.name} (line {macro.line}) uses it")
        return found

    def _classify(self, use: Node) -> None:
        function = cp.enclosing_function(use)
        parent = use.parent
        if function is None:
            if any(a.type == "static_assert_declaration" for a in _ancestors(use)):
                return  # evaluated with the new value by tile_constant's check
            holder = next((a for a in _ancestors(use) if a.type in ("declaration", "preproc_def")), None)
            named = ""
            if holder is not None:
                named = next((d.name for d in self.scope.declarations if d.node == holder), "") or (
                    self.text(holder.child_by_field_name("name")) if holder.type == "preproc_def" else "")
            self.refuse(f"{named or 'a namespace-scope definition'} is derived from it (line {self.line(use)}): "
                        "a factor that sizes other constants is not only a per-thread item count")
        # (L) the bound of an item loop
        if parent.type == "binary_expression" and operator(parent) == "<" and \
                parent.child_by_field_name("right") == use and parent.parent is not None and \
                parent.parent.type == "for_statement" and parent.parent.child_by_field_name("condition") == parent:
            self.loops.append(self._item_loop(parent.parent))
            return
        # (A) the slot count of a register array
        if parent.type == "array_declarator" and parent.child_by_field_name("size") == use:
            declaration = next((d for d in self.scope.declarations if contains(d.node, use)
                                and d.dims == (self.name,)), None)
            if declaration is None or declaration.function is None or \
                    set(declaration.specifiers) & {"__shared__", "static", "extern", "__constant__", "__device__"}:
                self.refuse(f"sizes an array that is not a plain local array of {self.name} slots "
                            f"({self.where(use)})")
            self.arrays.append(declaration)
            return
        # (S) the stride of a stride loop: `x0 += S * C`
        product = _outer(use)
        update = product.parent
        if product.type == "binary_expression" and operator(product) == "*" and update is not None and \
                update.type == "assignment_expression" and operator(update) == "+=" and \
                update.child_by_field_name("right") == product and update.parent is not None and \
                update.parent.type == "for_statement" and update.parent.child_by_field_name("update") == update:
            self.strides[update.parent.id] = update.parent
            return
        # (B) the per-thread chunk of a kernel: `const int base = gid * C` or an item index
        if self._in_item_index(use):
            return
        self.refuse(f"is used at {self.where(use)} (`{_line_text(self.parsed, use)}`), which is neither an item "
                    "loop's bound, a register array's slot count, a stride loop's step nor an item's index")

    def _in_item_index(self, use: Node) -> bool:
        """The use is in the initializer of a constant local integer that item indices are built from."""
        node = use
        while node.parent is not None and node.parent.type in ("binary_expression", "parenthesized_expression",
                                                               "cast_expression", "argument_list",
                                                               "call_expression"):
            if node.parent.type == "binary_expression" and operator(node.parent) not in _ARITHMETIC:
                return False
            if node.parent.type == "call_expression" and cast_name(node.parent) not in _CASTS:
                return False
            node = node.parent
        holder = node.parent
        if holder is None or holder.type != "init_declarator" or holder.child_by_field_name("value") != node:
            return False
        declaration = next((d for d in self.scope.declarations if d.init == node), None)
        if declaration is None or declaration.function is None or not _INT_TYPES.match(declaration.type) or \
                declaration.indirection or declaration.dims:
            return False
        self.chunk_bases.append(declaration)
        return True

    # -- item loops --------------------------------------------------------------------------------------
    def _item_loop(self, loop: Node) -> _ItemLoop:
        init, update = loop.child_by_field_name("initializer"), loop.child_by_field_name("update")
        condition = loop.child_by_field_name("condition")
        index = next((d for d in self.scope.declarations if init is not None and d.node == init), None)
        if index is None or index.init is None or self.text(index.init) != "0" or index.dims or \
                index.indirection or not _INT_TYPES.match(index.type):
            self.refuse(f"bounds the loop at {self.where(loop)}, which does not count an integer from 0")
        if self.text(condition.child_by_field_name("left")) != index.name or update is None or not (
                (update.type == "update_expression" and operator(update) == "++") or
                (update.type == "assignment_expression" and operator(update) == "+=" and
                 self.text(update.child_by_field_name("right")) == "1")):
            self.refuse(f"bounds the loop at {self.where(loop)}, which does not step its index by one")
        target = update.child_by_field_name("argument") or update.child_by_field_name("left")
        if self.text(unparen(target)) != index.name:
            self.refuse(f"bounds the loop at {self.where(loop)}, which steps another variable")
        if self.modified(index, loop.child_by_field_name("body")):
            self.refuse(f"the item loop at {self.where(loop)} changes its index in its body")
        return _ItemLoop(loop, index)

    def _check_array(self, array: cp.Declaration) -> None:
        function = cp.enclosing_function(array.node)
        for node in cp.nodes_of_type(function, "identifier"):
            if self.text(node) != array.name or contains(array.node, node) or self.declaration_of(node) is not array:
                continue
            parent = node.parent
            ok = parent.type == "subscript_expression" and parent.child_by_field_name("argument") == node
            if ok:
                listed = [n for n in parent.child_by_field_name("indices").named_children if n.type != "comment"]
                index = unparen(listed[0]) if len(listed) == 1 else None
                declared = self.declaration_of(index) if index is not None and index.type == "identifier" else None
                ok = declared is not None and id(declared) in {id(d) for d in (loop.index for loop in self.loops)} and \
                    any(contains(loop.loop, node) for loop in self.loops if loop.index is declared)
            if not ok:
                self.refuse(f"the register array {array.name} is used at {self.where(node)} other than as the "
                            f"slot of the item being handled (`{array.name}[b]` in an item loop)")

    def _check_loop(self, item: _ItemLoop) -> None:
        loop = item.loop
        body = loop.child_by_field_name("body")
        statements = [c for c in (body.named_children if body.type == "compound_statement" else [body])
                      if c.type != "comment"]
        guards = [s for s in statements if s.type != "declaration"]
        declarations = [s for s in statements if s.type == "declaration"]
        if len(guards) != 1 or guards[0].type != "if_statement" or statements[-1] is not guards[0] or \
                guards[0].child_by_field_name("alternative") is not None:
            self.refuse(f"the item loop at {self.where(loop)} is not its items' index declarations and one "
                        "guarded statement `if (x < n) ...`")
        items = [d for d in self.scope.declarations if any(d.node == s for s in declarations)]
        for declaration in items:
            if declaration.init is None or declaration.dims or declaration.indirection or \
                    not _INT_TYPES.match(declaration.type) or self.modified(declaration, body):
                self.refuse(f"{declaration.name} (line {declaration.line}) is not a constant item index")
        item.items = items
        self._check_body(loop)
        stride = next((s for s in self.strides.values() if contains(s.child_by_field_name("body"), loop)), None)
        function = cp.enclosing_function(loop)
        if stride is not None:
            item.shape = "batch"
            bound = self._check_batch(item, stride)
        elif cp.function_name(function) in self.kernels:
            item.shape = "chunk"
            bound = self._check_chunk(item, function)
        else:
            self.refuse(f"the item loop at {self.where(loop)} is neither inside a stride loop over {self.name} "
                        "items nor in a kernel whose launch scales with it")
        self._check_guard(item, guards[0], bound)
        # the index appears only in item indices and as a register slot
        for node in cp.nodes_of_type(body, "identifier"):
            if self.text(node) != item.index.name or self.declaration_of(node) is not item.index:
                continue
            if any(d.init is not None and contains(d.init, node) for d in items):
                continue
            parent = node.parent
            if parent.type == "subscript_argument_list" and parent.parent.child_by_field_name("argument") is not None \
                    and any(self.text(parent.parent.child_by_field_name("argument")) == a.name for a in self.arrays):
                continue
            self.refuse(f"the item loop's index {item.index.name} is used at {self.where(node)} other than in an "
                        "item's index or a register slot: the items are not independent of their batch position")

    def _check_body(self, loop: Node) -> None:
        body = loop.child_by_field_name("body")
        for node in cp.nodes_of_type(body, "return_statement", "goto_statement", "gnu_asm_expression",
                                     "break_statement"):
            if node.type == "break_statement" and not self._breaks(node, loop):
                continue
            self.refuse(f"the item loop at {self.where(loop)} has `{self.text(node).split(';')[0][:40]}` "
                        f"({self.where(node)})")
        self._check_calls(body, f"the item loop at {self.where(loop)}", set())
        # no variable declared outside the item loop is assigned in it (a reduction across items)
        for node in cp.nodes_of_type(body, "assignment_expression", "update_expression", "pointer_expression"):
            if node.type == "pointer_expression" and operator(node) != "&":
                continue
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            root = target
            while root is not None and root.type in ("subscript_expression", "field_expression",
                                                     "parenthesized_expression"):
                if root.type == "subscript_expression" and self._is_slot(root):
                    root = None
                    break
                if root.type == "field_expression" and operator(root) == "->":
                    root = None  # through a pointer: memory, checked with the other accesses
                    break
                if root.type == "subscript_expression" and self.scope.memory_space(root) != "local":
                    root = None
                    break
                root = root.child_by_field_name("argument") if root.type != "parenthesized_expression" else \
                    root.named_children[0]
            if root is None or root.type != "identifier":
                continue
            declaration = self.declaration_of(root)
            if declaration is not None and declaration.function is not None and not contains(loop, declaration.node):
                self.refuse(f"the item loop at {self.where(loop)} assigns {declaration.name}, declared outside it "
                            f"({self.where(node)}): its items are not independent")
            if declaration is None and self.scope.param(self.text(root), root) is not None:
                self.refuse(f"the item loop at {self.where(loop)} assigns the parameter {self.text(root)}")

    def _is_slot(self, subscript: Node) -> bool:
        argument = subscript.child_by_field_name("argument")
        return argument is not None and argument.type == "identifier" and \
            any(self.declaration_of(argument) is a for a in self.arrays)

    @staticmethod
    def _breaks(node: Node, loop: Node) -> bool:
        """The break leaves `loop` (its nearest enclosing loop or switch is `loop`)."""
        parent = node.parent
        while parent is not None and parent.type not in ("for_statement", "while_statement", "do_statement",
                                                         "switch_statement", "for_range_loop"):
            parent = parent.parent
        return parent == loop

    def _check_calls(self, node: Node, what: str, seen: set[str]) -> None:
        bodies = {f.name: f.node for f in self.scope.functions}
        for call in cp.nodes_of_type(node, "call_expression"):
            name = cp.call_name(call)
            if _COLLECTIVE.search(name):
                self.refuse(f"{what} calls {name}() ({self.where(call)}): a collective or an atomic")
            if name in bodies and name not in seen:
                seen.add(name)
                body = bodies[name]
                for param in params(self.parsed, body):
                    if "&" in param.indirection and "const" not in self.text(param.node).split():
                        self.refuse(f"{what} calls {name}(), which takes {param.name} by reference")
                for inner in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
                    target = unparen(inner.child_by_field_name("left") or inner.child_by_field_name("argument"))
                    if target.type in ("subscript_expression", "pointer_expression", "field_expression") and \
                            self.scope.memory_space(target) != "local":
                        self.refuse(f"{what} calls {name}(), which writes memory ({self.where(inner)})")
                if cp.nodes_of_type(body, "gnu_asm_expression"):
                    self.refuse(f"{what} calls {name}(), which holds inline asm")
                self._check_calls(body, what, seen)

    # -- shape A: a batch in a stride loop --------------------------------------------------------------
    def _check_batch(self, item: _ItemLoop, stride: Node) -> str:
        init = stride.child_by_field_name("initializer")
        base = next((d for d in self.scope.declarations if init is not None and d.node == init), None)
        condition = stride.child_by_field_name("condition")
        if base is None or base.init is None or condition is None or condition.type != "binary_expression" or \
                operator(condition) != "<" or self.text(condition.child_by_field_name("left")) != base.name:
            self.refuse(f"the stride loop at {self.where(stride)} is not `for (int x0 = ...; x0 < n; x0 += ...)`")
        body = stride.child_by_field_name("body")
        if self.modified(base, body):
            self.refuse(f"the stride loop at {self.where(stride)} changes {base.name} in its body")
        bound = condition.child_by_field_name("right")
        for node in (base.init, bound):
            if self._mentions_factor(node):
                self.refuse(f"the stride loop at {self.where(stride)} starts or ends at a value of {self.name}")
        self._invariant(bound, body, f"the bound of the stride loop at {self.where(stride)}")
        # the stride loop holds only register arrays, item loops and pragmas
        for child in body.named_children if body.type == "compound_statement" else [body]:
            if child.type == "comment" or cp.pragma_text(child):
                continue
            if child.type == "declaration" and any(a.node == child for a in self.arrays):
                continue
            if child.type == "for_statement" and any(loop.loop == child for loop in self.loops):
                continue
            self.refuse(f"the stride loop at {self.where(stride)} does more than its item loops "
                        f"(`{_line_text(self.parsed, child)}` at line {self.line(child)})")
        step = self._form(stride.child_by_field_name("update").child_by_field_name("right"), {}, 0, factor=True)
        per_item = _divide(step, "C") if step is not None else None
        if per_item is None or not _positive(per_item):
            self.refuse(f"the stride loop's step at {self.where(stride)} is not a positive multiple of "
                        f"{self.name}")
        scaled = [str(d) for launch in self.state.plan.launches for d in (*launch.grid, *launch.block)
                  if isinstance(d, str) and self.name in expr.names(d)]
        if scaled and not any("gdim" in key for key in per_item):
            self.refuse(f"the launch scales with it ({scaled[0]}), but the stride loop at {self.where(stride)} does "
                        "not span the grid (its step names no gridDim.x): the items a block takes would change")
        symbols = {id(base): "x0", id(item.index): "b"}
        want = _add(_symbol("x0"), _mul(_symbol("b"), per_item))
        for declaration in item.items:
            if self._form(declaration.init, symbols, 0) != want:
                self.refuse(f"the item index {declaration.name} (line {declaration.line}) is not "
                            f"`{base.name} + {item.index.name} * (step / {self.name})`")
        self.bases.append((base, body))
        return self.text(bound)

    def _check_bases(self) -> None:
        """A stride loop holds item loops, and its variable is used only in its items' indices; a local
        computed from the factor is used only in item indices (after every item loop is read)."""
        for stride in self.strides.values():
            if not any(loop.loop.parent == stride.child_by_field_name("body") for loop in self.loops):
                self.refuse(f"steps the loop at {self.where(stride)}, which holds no loop over {self.name} items")
        for array in self.arrays:  # a slot is filled and used within one pass, never carried to the next
            function = cp.enclosing_function(array.node)
            for node in cp.nodes_of_type(function, "identifier"):
                if self.text(node) != array.name or self.declaration_of(node) is not array:
                    continue
                stride = next((s for s in self.strides.values() if contains(s, node)), None)
                if stride is not None and not contains(stride.child_by_field_name("body"), array.node):
                    self.refuse(f"the register array {array.name} (line {array.line}) is declared outside the "
                                f"stride loop at {self.where(stride)}: its slots could carry values from one pass "
                                "to the next")
        item_inits = [d.init for loop in self.loops for d in loop.items]
        items = {id(d) for loop in self.loops for d in loop.items}
        for base in self.chunk_bases:
            if id(base) in items:
                continue  # an item index itself: its form is checked
            function = cp.enclosing_function(base.node)
            if self.modified(base, function):
                self.refuse(f"{base.name} (line {base.line}) is computed from it and changes")
            for node in cp.nodes_of_type(function, "identifier"):
                if self.text(node) == base.name and self.declaration_of(node) is base and \
                        not contains(base.node, node) and not any(contains(i, node) for i in item_inits):
                    self.refuse(f"{base.name} (line {base.line}) is computed from it and used at "
                                f"{self.where(node)} other than in an item's index")
        for base, body in self.bases:
            for node in cp.nodes_of_type(body, "identifier"):
                if self.text(node) == base.name and self.declaration_of(node) is base and \
                        not any(contains(d.init, node) for loop in self.loops for d in loop.items):
                    self.refuse(f"{base.name} is used at {self.where(node)} other than in an item's index")

    def _mentions_factor(self, node: Node) -> bool:
        return any(self.text(n) == self.name for n in cp.nodes_of_type(node, "identifier"))

    def _invariant(self, node: Node, within: Node, what: str) -> None:
        for leaf in cp.nodes_of_type(node, "identifier"):
            declaration = self.declaration_of(leaf)
            if declaration is not None and declaration.function is not None and self.modified(declaration, within):
                self.refuse(f"{what} changes inside it ({declaration.name})")

    # -- shape B: a per-thread chunk of a launch scaled by the factor -----------------------------------
    def _check_chunk(self, item: _ItemLoop, function: Node) -> str:
        block = self._block_size(cp.function_name(function))
        symbols = {id(item.index): "b"}
        contiguous = {("b",): 1, ("C", "tid"): 1, ("C", "bid"): block}
        strided = {("tid",): 1, ("b",): block, ("C", "bid"): block}
        for declaration in item.items:
            form = self._form(declaration.init, symbols, 0, factor=True, block=block)
            if form not in (contiguous, strided):
                self.refuse(f"the item index {declaration.name} (line {declaration.line}) is not "
                            f"`(blockIdx.x * {block} + threadIdx.x) * {self.name} + {item.index.name}` nor "
                            f"`blockIdx.x * ({block} * {self.name}) + {item.index.name} * {block} + threadIdx.x` "
                            f"(the launch's block size is {block})")
        # outside its item loops the kernel writes no memory, waits on no barrier and does not return
        body = function.child_by_field_name("body")
        loops = [loop.loop for loop in self.loops if contains(function, loop.loop)]
        for node in cp.nodes_of_type(body, "return_statement", "goto_statement", "gnu_asm_expression"):
            if not any(contains(loop, node) for loop in loops):
                self.refuse(f"the kernel {cp.function_name(function)} has `{self.text(node).split(';')[0][:40]}` "
                            f"({self.where(node)}): every thread of a wider launch would run it")
        for node in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
            if any(contains(loop, node) for loop in loops):
                continue
            target = unparen(node.child_by_field_name("left") or node.child_by_field_name("argument"))
            if target.type != "identifier" and self.scope.memory_space(target) != "local":
                self.refuse(f"the kernel {cp.function_name(function)} writes memory outside its item loops "
                            f"({self.where(node)}): every thread of a wider launch would write it")
        outside = [c for c in cp.nodes_of_type(body, "call_expression") if not any(contains(loop, c) for loop in loops)]
        for call in outside:
            self._check_calls(call, f"the kernel {cp.function_name(function)}", set())
        return ""

    def _block_size(self, kernel: str) -> int:
        launches = [launch for launch in self.state.plan.launches if launch.entry == kernel]
        if not launches:
            self.refuse(f"no launch of {kernel} in the plan")
        sizes = set()
        for launch in launches:
            try:
                dims = [expr.evaluate_int(d, self.state.constants) for d in launch.block]
            except ExpressionError:
                self.refuse(f"the block size of {kernel} ({launch.block[0]}) is not a constant of the source")
            if dims[1:] != [1, 1]:
                self.refuse(f"{kernel} is launched with a {'x'.join(map(str, dims))} block, not a 1-D one")
            if any(self.name in expr.names(str(d)) for d in launch.block if isinstance(d, str)):
                self.refuse(f"the block size of {kernel} depends on {self.name}")
            sizes.add(dims[0])
        if len(sizes) != 1:
            self.refuse(f"{kernel} is launched with several block sizes")
        return sizes.pop()

    def _check_guard(self, item: _ItemLoop, guard: Node, bound: str) -> None:
        condition = unparen(guard.child_by_field_name("condition").child_by_field_name("value") or
                            guard.child_by_field_name("condition"))
        conjuncts, pending = [], [condition]
        while pending:
            node = unparen(pending.pop())
            if node.type == "binary_expression" and operator(node) == "&&":
                pending += [node.child_by_field_name("left"), node.child_by_field_name("right")]
            else:
                conjuncts.append(node)
        names = {d.name for d in item.items}
        for conjunct in conjuncts:
            if conjunct.type != "binary_expression" or operator(conjunct) != "<":
                continue
            left, right = conjunct.child_by_field_name("left"), conjunct.child_by_field_name("right")
            if self.text(unparen(left)) not in names:
                continue
            if item.shape == "batch" and self.text(right) == bound:
                return
            if item.shape == "chunk" and right.type == "identifier" and self.declaration_of(right) is None:
                found = self.scope.param(self.text(right), right)
                if found is not None and not found[2].indirection and not self._param_assigned(found[0], right):
                    item.guard = (cp.function_name(found[0]), found[1])
                    return
        want = f"`if ({'/'.join(sorted(names)) or 'x'} < {bound or 'n'})`" if item.shape == "batch" else \
            "`if (x < n)` with n a scalar parameter of the kernel"
        self.refuse(f"the item loop at {self.where(item.loop)} does not guard its item by {want}")

    def _param_assigned(self, function: Node, node: Node) -> bool:
        name = self.text(node)
        for change in cp.nodes_of_type(function, "assignment_expression", "update_expression"):
            target = unparen(change.child_by_field_name("left") or change.child_by_field_name("argument"))
            if target.type == "identifier" and self.text(target) == name and self.declaration_of(target) is None:
                return True
        return False

    def _check_launch(self, chunks: list[_ItemLoop]) -> None:
        new_constants = parse_constants(_with_value(self.parsed, self.factor, 1))
        old_constants = self.state.constants
        plan = self.state.plan
        for item in chunks:
            kernel, index = item.guard
            for launch in (x for x in plan.launches if x.entry == kernel):
                grids = [str(g) for g in launch.grid]
                if not any(self.name in expr.names(g) for g in grids if not g.lstrip("-").isdigit()):
                    self.refuse(f"the launch of {kernel} does not scale with {self.name} (its grid "
                                f"{list(launch.grid)} names no {self.name}): one item per thread would leave "
                                "items without a thread")
                if index >= len(launch.args) or launch.args[index].kind is not ArgKind.SCALAR:
                    self.refuse(f"the launch of {kernel} passes no scalar for its item count")
                count = launch.args[index].value
                texts = [*grids, *(str(b) for b in launch.block), str(count)] + ([plan.supports] if plan.supports
                                                                                  else [])
                free = sorted({n for t in texts if isinstance(t, str) and not t.lstrip("-").isdigit()
                               for n in expr.names(t)} - set(old_constants) - set(new_constants))
                if len(free) > 3:
                    self.refuse(f"the launch of {kernel} depends on {len(free)} case parameters: too many to sample")
                checked = 0
                for values in itertools.product(_SAMPLES, repeat=len(free)):
                    env = dict(zip(free, values))
                    try:
                        if plan.supports and not expr.evaluate(plan.supports, {**env, **old_constants}):
                            continue
                        n = expr.evaluate_int(count, {**env, **old_constants})
                        old = _threads(launch, {**env, **old_constants})
                        new = _threads(launch, {**env, **new_constants})
                    except ExpressionError:
                        continue
                    if old * self.factor.value < n:
                        continue  # the case needs more than the original launch gives: not one it runs
                    if new < n:
                        self.refuse(f"with {self.name} = 1 the launch of {kernel} gives {new} threads for {n} items "
                                    f"({', '.join(f'{k} = {v}' for k, v in env.items())})")
                    checked += 1
                if not checked:
                    self.refuse(f"the launch of {kernel} could not be evaluated over sample case parameters")

    # -- memory ---------------------------------------------------------------------------------------
    def _check_memory(self) -> None:
        """No memory an item loop writes is read by one: items may then move between threads and passes."""
        reads, writes = [], []
        for item in self.loops:
            body = item.loop.child_by_field_name("body")
            for node in cp.nodes_of_type(body, "subscript_expression", "pointer_expression", "field_expression"):
                if node.type == "pointer_expression" and operator(node) != "*":
                    continue
                if node.type == "field_expression" and operator(node) != "->":
                    continue
                if node.type == "subscript_expression" and self._is_slot(node):
                    continue
                if node.parent is not None and node.parent.type in ("subscript_expression", "field_expression") \
                        and node.parent.child_by_field_name("argument") == node:
                    continue  # the outer access is the one that touches memory
                address = node.child_by_field_name("argument") if node.type != "subscript_expression" else node
                space = self.scope.memory_space(address)
                if space == "local":
                    continue
                (writes if is_written(node) else reads).append((node, space))
            for call in cp.nodes_of_type(body, "call_expression"):
                if cp.call_name(call) in ("__ldg", "__ldcg", "__ldca", "__ldcs", "__ldlu", "__ldcv"):
                    argument = call.child_by_field_name("arguments").named_children[0]
                    reads.append((argument, self.scope.memory_space(argument)))
        for node, space in writes + reads:
            if space is None:
                self.refuse(f"cannot tell which memory `{self.text(node)}` ({self.where(node)}) is in")
        for (w, w_space), (r, r_space) in itertools.product(writes, reads):
            if w_space != r_space:
                continue
            if w_space == "global" and self._distinct_buffers(w, r):
                continue
            self.refuse(f"the items write `{self.text(w)}` ({self.where(w)}) and read `{self.text(r)}` "
                        f"({self.where(r)}) in the same memory: moving items between threads could reorder them")

    def _distinct_buffers(self, write: Node, read: Node) -> bool:
        """Both accesses start from distinct pointer parameters of a kernel, bound to distinct buffers."""
        roots = []
        for node in (write, read):
            found = self._pointer_origin(node)
            if found is None or cp.function_name(found[0]) not in self.kernels:
                return False
            roots.append(found)
        (kernel, w_index, _), (_, r_index, _) = roots
        if w_index == r_index:
            return False
        for launch in self.state.plan.launches:
            if launch.entry != cp.function_name(kernel):
                continue
            names = [a.name if a.kind is ArgKind.BUFFER else None for a in launch.args]
            if max(w_index, r_index) >= len(names) or names[w_index] is None or names[w_index] == names[r_index]:
                return False
        return True

    def _pointer_origin(self, node: Node, depth: int = 0):
        """(function, index, parameter) of the pointer parameter an address starts from, through local
        pointers that are never reassigned; None where it is anything else."""
        if depth > _MAX_DEPTH:
            return None
        root = unwrap(node)
        while root.type in ("subscript_expression", "pointer_expression", "field_expression", "binary_expression"):
            if root.type == "binary_expression":
                if operator(root) not in ("+", "-"):
                    return None
                left = unwrap(root.child_by_field_name("left"))
                root = left if left.type != "number_literal" else unwrap(root.child_by_field_name("right"))
            else:
                root = unwrap(root.child_by_field_name("argument"))
        if root.type != "identifier":
            return None
        declaration = self.declaration_of(root)
        if declaration is not None:
            if declaration.function is None or declaration.init is None or not declaration.indirection or \
                    self.modified(declaration, cp.enclosing_function(declaration.node)):
                return None
            return self._pointer_origin(declaration.init, depth + 1)
        found = self.scope.param(self.text(root), root)
        return found if found is not None and found[2].indirection.startswith("*") else None

    # -- index forms ------------------------------------------------------------------------------------
    def _form(self, node: Node, symbols: dict[int, str], depth: int, factor: bool = False,
              block: int | None = None) -> Form | None:
        """The polynomial of an integer expression over thread and block indices, the loop variables in
        `symbols`, the factor (as "C" where `factor`, else refused) and numeric constants; None where it
        has another form."""
        if depth > _MAX_DEPTH:
            return None
        node = unparen(node)
        kind = node.type
        if kind == "number_literal":
            match = re.fullmatch(r"(\d+)[uUlL]*", self.text(node))
            return _number(int(match.group(1))) if match else None
        if kind == "field_expression":
            argument, name = node.child_by_field_name("argument"), self.text(node.child_by_field_name("field"))
            builtin = self.text(argument) if argument is not None else ""
            if (builtin, name) == ("threadIdx", "x"):
                return _symbol("tid")
            if (builtin, name) == ("blockIdx", "x"):
                return _symbol("bid")
            if (builtin, name) == ("blockDim", "x"):
                return _number(block) if block is not None else _symbol("bdim")
            if (builtin, name) == ("gridDim", "x"):
                return _symbol("gdim")
            return None
        if kind == "identifier":
            name = self.text(node)
            if name == self.name:
                return _symbol("C") if factor else None
            declaration = self.declaration_of(node)
            if declaration is not None and id(declaration) in symbols:
                return _symbol(symbols[id(declaration)])
            if declaration is not None and declaration.function is not None:
                if declaration.init is None or declaration.dims or declaration.indirection or \
                        self.modified(declaration, cp.enclosing_function(declaration.node)):
                    return None
                return self._form(declaration.init, symbols, depth + 1, factor, block)
            if name in self.constants and (declaration is None or declaration.function is None):
                return _number(self.constants[name])
            return None
        if kind == "binary_expression" and operator(node) in _ARITHMETIC:
            left = self._form(node.child_by_field_name("left"), symbols, depth + 1, factor, block)
            right = self._form(node.child_by_field_name("right"), symbols, depth + 1, factor, block)
            if left is None or right is None:
                return None
            op = operator(node)
            return _mul(left, right) if op == "*" else _add(left, right, 1 if op == "+" else -1)
        if kind == "unary_expression" and operator(node) in ("-", "+"):
            inner = self._form(node.child_by_field_name("argument"), symbols, depth + 1, factor, block)
            return None if inner is None else (_mul(inner, _number(-1)) if operator(node) == "-" else inner)
        if kind == "cast_expression":
            return self._form(node.child_by_field_name("value"), symbols, depth + 1, factor, block)
        if kind == "call_expression" and cast_name(node) in _CASTS:
            arguments = [a for a in node.child_by_field_name("arguments").named_children if a.type != "comment"]
            return self._form(arguments[0], symbols, depth + 1, factor, block) if len(arguments) == 1 else None
        return None


def _divide(form: Form, symbol: str) -> Form | None:
    """form / symbol where every monomial holds the symbol once; None otherwise."""
    out: Form = {}
    for key, value in form.items():
        if key.count(symbol) != 1:
            return None
        rest = list(key)
        rest.remove(symbol)
        out[tuple(rest)] = value
    return out


def _positive(form: Form) -> bool:
    """One monomial with a positive coefficient over sizes that are positive (grid and block sizes)."""
    return len(form) == 1 and all(s in ("gdim", "bdim") for s in next(iter(form))) and next(iter(form.values())) > 0


def _outer(node: Node) -> Node:
    """The multiplication the node is an operand of (through parentheses), or the node itself."""
    parent = node.parent
    while parent is not None and parent.type == "parenthesized_expression":
        node, parent = parent, parent.parent
    if parent is not None and parent.type == "binary_expression" and operator(parent) == "*":
        return parent
    return node


def _ancestors(node: Node):
    node = node.parent
    while node is not None:
        yield node
        node = node.parent


def _line_text(parsed: cp.ParsedSource, node: Node) -> str:
    return parsed.source.splitlines()[node.start_point.row].strip()[:80]


def _threads(launch, env: dict) -> int:
    grid = 1
    for value in launch.grid:
        grid *= expr.evaluate_int(value, env)
    block = 1
    for value in launch.block:
        block *= expr.evaluate_int(value, env)
    return grid * block


def _with_value(parsed: cp.ParsedSource, factor: _Factor, value: int) -> str:
    start, end = factor.digits
    return (parsed.data[:start] + str(value).encode() + parsed.data[end:]).decode("utf-8")


# -- the transform ------------------------------------------------------------------------------------------

class Uncoarsen(Transform):
    name = "uncoarsen"
    intent = ("Give each thread a small fixed batch of independent items (a loop over a compile-time factor), so "
              "that fewer threads each keep several loads in flight and share their index arithmetic.")
    role = Role.MECHANISM
    removes = ()
    adds = ()

    def find(self, state: KernelState) -> list[Anchor]:
        return [site.anchor for site in self._sites(state) if not site.problem]

    def refusals(self, state: KernelState) -> list[tuple[str, str]]:
        """(constant, reason) of every loop-bounding constant that is not a coarsening factor, for reports."""
        return [(site.factor.name, site.problem) for site in self._sites(state) if site.problem]

    def _sites(self, state: KernelState) -> list[_Site]:
        parsed = cp.parse(state.source)
        scope = Scope(parsed)
        sites = []
        for factor in _factors(parsed):
            if not self._bounds_a_loop(parsed, factor):
                continue
            line_start = parsed.data.rfind(b"\n", 0, factor.digits[0]) + 1
            line_end = parsed.data.find(b"\n", factor.digits[1])
            snippet = parsed.data[line_start:line_end if line_end >= 0 else None].decode("utf-8", "replace").strip()
            site = _Site(factor, Anchor("<file>", factor.kind, f"{factor.name}:{factor.value}->1", snippet))
            analysis = _Analysis(state, parsed, scope, factor)
            try:
                analysis.analyse()
                check_constant(state, _with_value(parsed, factor, 1), factor.name)
            except (_Refused, NotApplicable) as refused:
                site.problem = str(refused)
            site.loops = analysis.loops
            sites.append(site)
        return sites

    @staticmethod
    def _bounds_a_loop(parsed: cp.ParsedSource, factor: _Factor) -> bool:
        for loop in cp.nodes_of_type(parsed.root, "for_statement"):
            condition = loop.child_by_field_name("condition")
            if condition is not None and condition.type == "binary_expression" and operator(condition) == "<" and \
                    parsed.text(condition.child_by_field_name("right")) == factor.name:
                return True
        return False

    def _site(self, state: KernelState, anchor: Anchor) -> _Site:
        match = _KEY.match(anchor.key)
        if anchor.function != "<file>" or match is None:
            raise NotApplicable(f"uncoarsen needs a file anchor keyed `NAME:OLD->1`, not {anchor}")
        sites = [s for s in self._sites(state) if s.factor.name == match["name"]]
        if not sites:
            raise NotApplicable(f"uncoarsen: {match['name']} bounds no item loop here (or is no constant above 1)")
        return sites[0]

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        site = self._site(state, anchor)
        old = int(_KEY.match(anchor.key)["old"])
        if site.factor.value != old:
            raise NotApplicable(f"uncoarsen: {site.factor.name} is {site.factor.value} here, not {old}")
        if site.problem:
            raise NotApplicable(site.problem)
        parsed = cp.parse(state.source)
        source = _with_value(parsed, site.factor, 1)
        shapes = sorted({loop.shape for loop in site.loops})
        return self.rewrite(state, site.anchor, Direction.BACKWARD, source,
                            carrier={"constant": site.factor.name, "old": old, "new": 1},
                            note=f"{site.factor.name}: {old} items per thread -> 1 ({len(site.loops)} item loop(s), "
                                 f"{' and '.join(shapes)})")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        match = _KEY.match(anchor.key)
        if anchor.function != "<file>" or match is None:
            raise NotApplicable(f"uncoarsen needs a file anchor keyed `NAME:OLD->1`, not {anchor}")
        name, old = match["name"], int(match["old"])
        parsed = cp.parse(state.source)
        factor = next((f for f in _one_valued(parsed) if f.name == name), None)
        if factor is None:
            raise NotApplicable(f"uncoarsen: {name} is not a constant set to 1 here")
        coarse = KernelState(source=_with_value(parsed, factor, old), plan=state.plan)
        try:
            again = self.backward(coarse, Anchor("<file>", factor.kind, anchor.key))
        except NotApplicable as exc:
            raise NotApplicable(f"uncoarsen: with {name} = {old} the kernel is no coarsening by it: {exc}") from None
        if again.state.source != state.source:
            raise NotApplicable(f"uncoarsen: {name} = {old} does not give back this kernel")
        return self.rewrite(state, again.anchor, Direction.FORWARD, coarse.source,
                            carrier={"constant": name, "old": 1, "new": old},
                            note=f"{name}: 1 item per thread -> {old}")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """Constants set to 1 that bound item loops where setting them to the factor the carrier lists (its
        first whole `old` value above 1; 4 when it lists none) makes a coarsening this transform would
        take back to 1: forward coarsens there."""
        factors = [v for v in self.carrier_values(carrier, "old") if isinstance(v, int) and not isinstance(v, bool)
                   and v > 1]
        factor = factors[0] if factors else 4
        parsed = cp.parse(state.source)
        anchors = []
        for one in _one_valued(parsed):
            if not self._bounds_a_loop(parsed, one):
                continue
            anchor = Anchor("<file>", one.kind, f"{one.name}:{factor}->1", parsed.text(one.node).strip())
            try:
                self.forward(state, anchor)
            except NotApplicable:
                continue
            anchors.append(anchor)
        return anchors


def _one_valued(parsed: cp.ParsedSource) -> list[_Factor]:
    """Namespace-scope integral constants set to the literal 1 (where forward puts a factor back)."""
    found = []
    for declaration in cp.declarations(parsed):
        if declaration.function is None and declaration.init is not None and declaration.constant and \
                not declaration.indirection and not declaration.dims and _INT_TYPES.match(declaration.type) and \
                declaration.init.type == "number_literal" and re.fullmatch(r"1[uUlL]*", parsed.text(declaration.init)):
            start = declaration.init.start_byte
            found.append(_Factor(declaration.name, "declaration", 1, declaration.node, (start, start + 1)))
    for macro in cp.macros(parsed):
        value = macro.node.child_by_field_name("value")
        if macro.params is None and value is not None and re.fullmatch(r"1[uUlL]*", parsed.text(value).strip()):
            text = parsed.text(value)
            start = value.start_byte + (len(text) - len(text.lstrip()))
            found.append(_Factor(macro.name, "macro", 1, macro.node, (start, start + 1)))
    return found


register(Uncoarsen())
