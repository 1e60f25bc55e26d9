"""unswizzle_shared: an XOR-swizzled shared-memory layout becomes the identity layout.

A swizzle permutes the 16-byte chunks (or elements) of each shared-memory row by XOR with a phase
taken from the row (`chunk ^ (row % 8)`, `col ^ (row & 7)`, `(2 * ks + half) ^ fa.phase` with
`fa.phase = lane % SWIZZLE_ROWS`), so that the rows an ldmatrix or a copy touches at once fall in
different banks. Backward drops the XOR, keeping the chunk: `row * ROW_BYTES + ((chunk ^ (row % 8)) *
16)` becomes `row * ROW_BYTES + (chunk * 16)`.

Correct by construction, provided every access of the buffer changes together: for each row r the
swizzled map c -> c ^ phase(r) and the identity c -> c are both bijections of the row's chunks onto
the same chunk slots, so writers and readers that agreed on the swizzled slot of logical (r, c) agree
on the identity slot too, and no two logical chunks share a slot in either layout. Hence ONE mechanism
is the whole family of XOR sites of a buffer: the swizzle helper (`swizzle(row, chunk)`) AND every other
XOR that addresses the same tiles (the precomputed per-lane phase of an ldmatrix address helper, an
inline `tile[r][c ^ (r & 7)]`). Helpers return byte offsets whose buffer cannot be told apart
statically, so every helper XOR of a file belongs to one family with every inline XOR; where there is
no helper, inline XORs form one family per shared buffer.

A site is an XOR one of whose operands is a phase (`x % C`, `x & C` with C constant, or a variable or
struct field only ever assigned such a value) and which addresses shared memory: it is returned by a
device helper that scales it into an offset or whose result is added to a shared-memory address, or
it sits in the index (or the address arithmetic) of a shared-memory access. XORs without a phase
operand (`lane ^ j` of a butterfly, `i ^ j` of a bitonic partner) are algorithms, not layouts, and
are never touched. A helper whose result also addresses global memory is refused.

Anchor: function = the swizzle helper (or, for inline families, the first function with a site),
kind "function" (or "subscript"), key `<helper or buffer> {...}` whose payload lists each site's
function, old and new text and where the new text sits; forward restores exactly those XORs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import (
    Scope,
    contains,
    function_feature_names,
    function_ranges,
    make_key,
    occurrences,
    operator,
    params,
    payload,
    splice,
    unparen,
    unwrap,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

_PRIMARY = frozenset({"identifier", "field_expression", "subscript_expression", "number_literal",
                      "parenthesized_expression", "call_expression", "qualified_identifier"})
_ARITHMETIC = frozenset({"binary_expression", "parenthesized_expression", "cast_expression"})
_ALONE = frozenset({"subscript_argument_list", "argument_list", "init_declarator", "return_statement",
                    "expression_statement", "parenthesized_expression"})
_CONSTANT = frozenset({"constexpr", "const"})


@dataclass
class XorSite:
    node: Node  # the `^` binary expression
    function: str
    kind: str  # "helper" (returned by a device helper) or "inline"
    buffer: str  # the shared buffer for an inline site, "" for a helper
    keep: Node  # the operand that stays (the chunk)
    phase: Node  # the operand that goes
    replace: Node = field(init=False)  # the node the edit replaces (the XOR or its parentheses)

    def __post_init__(self) -> None:
        parent = self.node.parent
        if parent is not None and parent.type == "parenthesized_expression" and unparen(parent) == self.node \
                and self.keep.type in _PRIMARY:
            self.replace = parent  # `((chunk ^ p) * 16)` -> `(chunk * 16)`
        else:
            self.replace = self.node

    def new_text(self, parsed: cp.ParsedSource) -> str:
        """The kept operand; without its parentheses where the XOR stood alone in a list or a
        statement (`t[c][(r + k) ^ p]` -> `t[c][r + k]`)."""
        if self.keep.type == "parenthesized_expression" and self.replace == self.node and \
                self.node.parent is not None and self.node.parent.type in _ALONE:
            return parsed.text(unparen(self.keep))
        return parsed.text(self.keep)


class _Analysis:
    def __init__(self, state: KernelState):
        self.state = state
        self.parsed = cp.parse(state.source)
        self.scope = Scope(self.parsed)
        self.constants = set(state.constants) | {m.name for m in cp.macros(self.parsed)}
        self.constants |= {d.name for d in self.scope.declarations if _CONSTANT & set(d.specifiers)}

    def text(self, node: Node) -> str:
        return self.parsed.text(node)

    # -- phases ------------------------------------------------------------------------------------
    def is_phase(self, node: Node, depth: int = 0) -> bool:
        if depth > 6:
            return False
        node = unwrap(node)
        if node.type == "binary_expression" and operator(node) in ("%", "&"):
            right = unwrap(node.child_by_field_name("right"))
            left = unwrap(node.child_by_field_name("left"))
            return self._constant(right) or (operator(node) == "&" and self._constant(left))
        if node.type == "identifier":
            declaration = self.scope.declaration(self.text(node), node)
            if declaration is None or declaration.function is None or declaration.init is None:
                return False
            assigned = self._assignments(lambda left: left.type == "identifier" and self.text(left) == declaration.name,
                                         cp.enclosing_function(node))
            return self.is_phase(declaration.init, depth + 1) and all(self.is_phase(a, depth + 1) for a in assigned)
        if node.type == "field_expression":
            name = self.text(node.child_by_field_name("field"))
            assigned = self._assignments(lambda left: left.type == "field_expression"
                                         and self.text(left.child_by_field_name("field")) == name, self.parsed.root)
            return bool(assigned) and all(self.is_phase(a, depth + 1) for a in assigned)
        return False

    def _constant(self, node: Node) -> bool:
        return node.type == "number_literal" or (node.type == "identifier" and self.text(node) in self.constants)

    def _assignments(self, matches, within: Node) -> list[Node]:
        found = []
        for node in cp.nodes_of_type(within, "assignment_expression"):
            if matches(unparen(node.child_by_field_name("left"))):
                found.append(node.child_by_field_name("right"))
        return found

    # -- sites -------------------------------------------------------------------------------------
    def sites(self) -> list[XorSite]:
        found = []
        for node in cp.nodes_of_type(self.parsed.root, "binary_expression"):
            if operator(node) != "^":
                continue
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if self.is_phase(right):
                keep, phase = left, right
            elif self.is_phase(left):
                keep, phase = right, left
            else:
                continue
            function_node = cp.enclosing_function(node)
            if function_node is None:
                continue
            function = cp.function_name(function_node)
            if self._returned(node) and not self.scope.is_kernel(function_node):
                found.append(XorSite(node, function, "helper", "", keep, phase))
                continue
            buffer = self._shared_buffer(node)
            if buffer:
                found.append(XorSite(node, function, "inline", buffer, keep, phase))
        return found

    def _returned(self, node: Node) -> bool:
        parent = node.parent
        while parent is not None and parent.type != "function_definition":
            if parent.type == "return_statement":
                return True
            if parent.type == "lambda_expression":
                return False
            parent = parent.parent
        return False

    def _chain_top(self, node: Node) -> Node:
        """The whole arithmetic expression `node` is part of (up through operators, parentheses and casts)."""
        while node.parent is not None and (node.parent.type in _ARITHMETIC or (
                node.parent.type == "argument_list" and node.parent.parent.type == "call_expression"
                and node.parent.parent.child_by_field_name("function").type == "template_function")):
            node = node.parent if node.parent.type != "argument_list" else node.parent.parent
        return node

    def _space_of_chain(self, top: Node) -> tuple[str | None, str]:
        """The memory space an arithmetic expression addresses, with the buffer's name: the array it
        indexes, or any address term in it."""
        holder = top.parent
        if holder is not None and holder.type == "subscript_argument_list":
            space = self.scope.memory_space(holder.parent.child_by_field_name("argument"))
            if space in ("shared", "global"):
                return space, self._root(holder.parent)
        for leaf in cp.nodes_of_type(top, "identifier", "call_expression", "subscript_expression"):
            space = self.scope.memory_space(leaf)
            if space in ("shared", "global"):
                root = unwrap(leaf)
                while root.type in ("subscript_expression", "pointer_expression"):
                    root = unwrap(root.child_by_field_name("argument"))
                return space, self.text(root) if root.type == "identifier" else self.text(leaf)
        return None, ""

    def _shared_buffer(self, node: Node) -> str:
        """The shared buffer an inline XOR addresses: through a subscript index, a local initialised
        from it and used in one, or the address arithmetic it sits in; "" when it addresses none."""
        ancestor = node.parent
        while ancestor is not None and ancestor.type != "function_definition":
            if ancestor.type == "subscript_expression":
                indices = ancestor.child_by_field_name("indices")
                if indices is not None and contains(indices, node):
                    space = self.scope.memory_space(ancestor.child_by_field_name("argument"))
                    if space == "shared":
                        return self._root(ancestor)
            if ancestor.type == "init_declarator" and ancestor.parent.type == "declaration":
                name = self.text(unparen(ancestor.child_by_field_name("declarator")))
                function = cp.enclosing_function(ancestor)
                for subscript in cp.nodes_of_type(function, "subscript_expression"):
                    indices = subscript.child_by_field_name("indices")
                    if subscript.start_byte > ancestor.end_byte and indices is not None and any(
                            self.text(i) == name for i in cp.nodes_of_type(indices, "identifier")) and \
                            self.scope.memory_space(subscript.child_by_field_name("argument")) == "shared":
                        return self._root(subscript)
                break
            ancestor = ancestor.parent
        space, name = self._space_of_chain(self._chain_top(node))
        return name if space == "shared" else ""

    def _root(self, subscript: Node) -> str:
        root = subscript
        while root.type == "subscript_expression":
            root = unwrap(root.child_by_field_name("argument"))
        return self.text(root)

    # -- helper checks -----------------------------------------------------------------------------
    def helper_problem(self, helpers: set[str], sites: list[XorSite]) -> str:
        """Why the helpers of a family cannot be unswizzled ("" when they can): a call whose result
        addresses global memory, or no sign that the helpers address shared memory at all."""
        shared_use = False
        for name in sorted(helpers):
            for call in self.scope.calls.get(name, []):
                space, term = self._space_of_chain(self._chain_top(call))
                if space == "global":
                    line = call.start_point.row + 1
                    return f"{name}() also addresses global memory ({term}, line {line}): its layout is not only shared"
                shared_use |= space == "shared"
        scaled = any(self._scaled(site) for site in sites if site.kind == "helper")
        if not shared_use and not scaled:
            return f"{', '.join(sorted(helpers))}: no call adds the result to a shared-memory address"
        return ""

    def _scaled(self, site: XorSite) -> bool:
        """The XOR is scaled into an offset next to a row term: `row * RB + ((c ^ p) * 16)`."""
        node, scaled = site.node, False
        while node.parent is not None and node.parent.type in _ARITHMETIC | {"argument_list", "call_expression"}:
            node = node.parent
            if node.type == "binary_expression" and operator(node) in ("*", "<<"):
                scaled = True
            if node.type == "binary_expression" and operator(node) == "+" and scaled:
                return True
        return False


@dataclass
class _Family:
    head: str
    function: str
    kind: str
    sites: list[XorSite]
    problem: str = ""


def _families(analysis: _Analysis) -> list[_Family]:
    sites = analysis.sites()
    helpers = [s for s in sites if s.kind == "helper"]
    if helpers:
        names = {s.function for s in helpers}
        primary = next((s for s in helpers if _own_phase(analysis, s)), helpers[0])
        family = _Family(primary.function, primary.function, "function", sorted(sites, key=lambda s: s.node.start_byte))
        family.problem = analysis.helper_problem(names, helpers)
        return [family]
    families: dict[str, _Family] = {}
    for site in sites:
        families.setdefault(site.buffer, _Family(site.buffer, site.function, "subscript", [])).sites.append(site)
    return list(families.values())


def _own_phase(analysis: _Analysis, site: XorSite) -> bool:
    """The helper computes the phase from its own parameters (`swizzle(row, chunk)`: row % 8)."""
    function = cp.enclosing_function(site.node)
    names = {p.name for p in params(analysis.parsed, function)}
    return any(analysis.text(i) in names for i in cp.nodes_of_type(site.phase, "identifier"))


class UnswizzleShared(Transform):
    name = "unswizzle_shared"
    intent = ("Lay shared-memory tiles out with an XOR swizzle of 16-byte chunks by row phase, applied identically "
              "where tiles are written and where they are read, so that ldmatrix and copies hit distinct banks.")
    role = Role.MECHANISM
    removes = ("xor_swizzle",)
    scope = "family"  # one anchor is one swizzle family, whose sites may span several functions (the audit's locus)

    def find(self, state: KernelState) -> list[Anchor]:
        return [anchor for anchor, _, _ in self._plans(state) if anchor is not None]

    def _plans(self, state: KernelState) -> list[tuple[Anchor | None, _Family, list[tuple[int, int, str]]]]:
        analysis = _Analysis(state)
        plans = []
        for family in _families(analysis):
            if family.problem:
                plans.append((None, family, []))
                continue
            edits = [(s.replace.start_byte, s.replace.end_byte, s.new_text(analysis.parsed)) for s in family.sites]
            new_data, starts = splice(analysis.parsed.data, edits)
            new_parsed = cp.parse(new_data.decode("utf-8"))
            records = []
            for site, (start, end, text), new_start in zip(family.sites, edits, starts):
                at = occurrences(new_data, text, function_ranges(new_parsed, site.function)).index(new_start)
                records.append({"fn": site.function, "from": analysis.parsed.data[start:end].decode("utf-8"),
                                "to": text, "at": at})
            snippet = analysis.text(family.sites[0].replace)
            anchor = Anchor(family.function, family.kind, make_key(family.head, {"sites": records}), snippet)
            plans.append((anchor, family, edits))
        return plans

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        head, facts = payload(anchor.key)
        plans = self._plans(state)
        matching = [p for p in plans if p[1].head == head]
        if not matching:
            raise NotApplicable(f"no XOR swizzle of shared memory named {head} (found: "
                                f"{', '.join(p[1].head for p in plans) or 'none'})")
        found, family, edits = matching[0]
        if found is None:
            raise NotApplicable(family.problem)
        if facts and payload(found.key)[1] != facts:
            raise NotApplicable(f"the swizzle family of {head} differs from the one the anchor records")
        source = splice(cp.parse(state.source).data, edits)[0].decode("utf-8")
        return self._result(state, found, source, Direction.BACKWARD, family.sites)

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        head, facts = payload(anchor.key)
        records = facts.get("sites")
        if not records:
            raise NotApplicable(f"anchor {head} does not record the swizzle sites to restore "
                                f"(take anchors from unswizzle_shared.find on the swizzled kernel)")
        parsed = cp.parse(state.source)
        edits = []
        for record in records:
            found = occurrences(parsed.data, record["to"], function_ranges(parsed, record["fn"]))
            if record["at"] >= len(found):
                raise NotApplicable(f"the unswizzled index `{record['to']}` #{record['at']} is not in {record['fn']}")
            start = found[record["at"]]
            end = start + len(record["to"].encode("utf-8"))
            if _inside_swizzle(parsed.data, start, record):
                raise NotApplicable(f"`{record['to']}` #{record['at']} in {record['fn']} is swizzled already "
                                    f"(another anchor named this site)")
            node = parsed.root.descendant_for_byte_range(start, end)
            if node is None or node.start_byte != start or node.end_byte != end:
                raise NotApplicable(f"`{record['to']}` in {record['fn']} is not a whole expression any more")
            edits.append((start, end, record["from"]))
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self._result(state, anchor, source, Direction.FORWARD, [])

    def _result(self, state: KernelState, anchor: Anchor, source: str, direction: Direction,
                sites: list[XorSite]) -> Rewrite:
        if source == state.source:
            raise NotApplicable(f"{self.name} changed nothing at {anchor}")
        new_state = KernelState(source=source, plan=state.plan)
        swizzled, plain = (state, new_state) if direction is Direction.BACKWARD else (new_state, state)
        if not sites:
            sites = next((f.sites for f in _families(_Analysis(swizzled)) if f.head == payload(anchor.key)[0]), [])
        # The feature reader credits xor_swizzle to functions that subscript shared memory with an XOR
        # index; declare it where it goes away at the anchor's function.
        changed = ("xor_swizzle",) if "xor_swizzle" in (function_feature_names(swizzled.source, anchor.function)
                                                        - function_feature_names(plain.source, anchor.function)) else ()
        carrier: dict[str, int] = {"sites": len(payload(anchor.key)[1].get("sites", []))}
        period = self._period(swizzled, sites)
        if period:
            carrier["swizzle_period"] = period
        return Rewrite(self.name, direction, anchor, new_state,
                       removes=changed if direction is Direction.BACKWARD else (),
                       adds=changed if direction is Direction.FORWARD else (),
                       carrier=carrier,
                       note=("XOR swizzle dropped at every site of the family: identity layout on both the "
                             "writing and the reading side" if direction is Direction.BACKWARD else
                             "XOR swizzle restored at every site of the family"))

    @staticmethod
    def _period(state: KernelState, sites: list[XorSite]) -> int | None:
        """The swizzle's period in rows, where a site's phase is `x % C` or `x & (C - 1)` with C known."""
        constants = state.constants
        for site in sites:
            phase = unwrap(site.phase)
            if phase.type != "binary_expression":
                continue
            right = unwrap(phase.child_by_field_name("right")).text.decode()
            value = constants.get(right) if not right.isdigit() else int(right)
            if isinstance(value, int):
                return value if operator(phase) == "%" else value + 1
        return None


register(UnswizzleShared())


def _inside_swizzle(data: bytes, start: int, record: dict) -> bool:
    """Whether the unswizzled index at `start` already sits inside the swizzled expression: a
    second forward there would XOR it twice, which is no swizzle at all."""
    swizzled, plain = record["from"].encode("utf-8"), record["to"].encode("utf-8")
    offset = swizzled.find(plain)
    return offset >= 0 and start >= offset and data[start - offset:start - offset + len(swizzled)] == swizzled
