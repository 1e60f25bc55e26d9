"""unpad_shared: a padded shared-memory row stride becomes the unpadded one.

Padding a shared tile's rows (`constexpr int EPI_STRIDE = BLOCK_N + EPI_PAD;`, `__shared__ float
tile[32][32 + 1];`) shifts consecutive rows by a few banks, so column-wise or fragment-wise accesses
avoid bank conflicts. Backward removes the padding term: `BLOCK_N + EPI_PAD` becomes `BLOCK_N`,
`[32 + 1]` becomes `[32]`. Every index is kept consistent because every access reaches the stride
through the one name (the constant, or the array's declared extent that 2-D subscripts use): with the
row stride S (padded) or W (unpadded), element (r, c) of a row of width W sits at r * S + c or r * W + c,
and for c < W both maps are injective, so writers and readers that agreed before still agree. The
shared allocation shrinks with the constant (a plan that reads it follows).

A site is a constant or a shared array extent of the form `W + P`, where P is the padding: a literal or
a name that says so (`PAD`, `SKEW`), smaller than W where both are known. A constant is a stride only
if it is used as one: as a multiplier in the address arithmetic of shared memory or as an extent of a
shared array; other uses are allowed only inside sizes (static_assert, constants derived from it by
multiplication). A use elsewhere (a loop bound, a comparison, a global-memory stride) refuses the
site, and so does a padded array that is also used as a flat pointer. Where the unpadded stride is less
aligned than the padded one (vector accesses of rows could misalign), the site is refused too.

Anchor: the declaring function or "<file>", kind "declaration", key `<NAME> {...}` or
`<array>[<dim>] {...}` with the padded and unpadded text; carrier: the padding amount. No source or
SASS feature shows padding, so the rewrite declares no removed feature.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.features.source import FILE_LOCUS
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import Scope, make_key, operator, payload, splice, unparen, unwrap
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

_PAD_NAME = re.compile(r"pad|skew", re.IGNORECASE)
_ARITHMETIC = frozenset({"binary_expression", "parenthesized_expression", "cast_expression"})
_TESTS = frozenset({"<", ">", "<=", ">=", "==", "!=", "&&", "||"})


@dataclass
class PadSite:
    head: str  # "EPI_STRIDE" or "tile[1]"
    function: str  # the declaring function or FILE_LOCUS
    padded: Node  # the `W + P` expression
    width: Node  # W
    pad: Node  # P
    problem: str = ""


class _Analysis:
    def __init__(self, state: KernelState):
        self.parsed = cp.parse(state.source)
        self.scope = Scope(self.parsed)
        self.constants = state.constants

    def text(self, node: Node) -> str:
        return self.parsed.text(node)

    def value(self, node: Node) -> int | None:
        node = unwrap(node)
        text = self.text(node)
        if node.type == "number_literal":
            try:
                return int(text.rstrip("uUlL"), 0)
            except ValueError:
                return None
        found = self.constants.get(text)
        return found if isinstance(found, int) else None

    def padding(self, node: Node) -> tuple[Node, Node] | None:
        """(width, pad) of `W + P` where P is the padding."""
        node = unparen(node)
        if node.type != "binary_expression" or operator(node) != "+":
            return None
        left, right = unparen(node.child_by_field_name("left")), unparen(node.child_by_field_name("right"))
        for width, pad in ((left, right), (right, left)):
            if pad.type == "number_literal" or (pad.type == "identifier" and _PAD_NAME.search(self.text(pad))):
                w, p = self.value(width), self.value(pad)
                if w is not None and p is not None and not 0 < p < w:
                    continue
                return width, pad
        return None

    def sites(self) -> list[PadSite]:
        found = []
        for declaration in self.scope.declarations:
            specifiers = set(declaration.specifiers)
            function = declaration.function or FILE_LOCUS
            if declaration.constant and not declaration.dims and declaration.init is not None:
                padding = self.padding(declaration.init)
                if padding is not None:
                    site = PadSite(declaration.name, function, unparen(declaration.init), *padding)
                    site.problem = self._stride_problem(declaration)
                    found.append(site)
            elif "__shared__" in specifiers and len(declaration.dims) >= 2:
                extents = self._extents(declaration.node, declaration.name)
                for dim, extent in enumerate(extents):
                    padding = self.padding(extent) if dim > 0 else None
                    if padding is not None:
                        site = PadSite(f"{declaration.name}[{dim}]", function, unparen(extent), *padding)
                        site.problem = self._array_problem(declaration, len(extents))
                        found.append(site)
        for site in found:
            if not site.problem:
                site.problem = self._alignment_problem(site)
        return found

    def _extents(self, declaration: Node, name: str) -> list[Node]:
        """The size nodes of an array declarator, outermost first."""
        for declarator in cp.nodes_of_type(declaration, "array_declarator"):
            if declarator.parent.type == "array_declarator":
                continue
            sizes, node = [], declarator
            while node.type == "array_declarator":
                sizes.insert(0, node.child_by_field_name("size"))
                node = node.child_by_field_name("declarator")
            if self.text(node) == name:
                return sizes
        return []

    # -- checks ------------------------------------------------------------------------------------
    def _uses(self, name: str, declaration: cp.Declaration) -> list[Node]:
        within = cp.enclosing_function(declaration.node) or self.parsed.root
        inside = declaration.node
        return [n for n in self._identifiers(within).get(name, ())
                if not (inside.start_byte <= n.start_byte < inside.end_byte)
                and self.scope.declaration(name, n) in (declaration, None)]

    def _identifiers(self, within: Node) -> dict[str, tuple[Node, ...]]:
        """The identifiers under `within` by their text, each name's in source order: made once per tree and
        function, since a walk asks for each constant's uses at every step (kept with the parse)."""
        def by_name(parsed: cp.ParsedSource) -> Iterator[tuple[str, tuple[Node, ...]]]:
            found: dict[str, list[Node]] = {}
            for node in cp.nodes_of_type(within, "identifier"):
                found.setdefault(parsed.text(node), []).append(node)
            return ((text, tuple(nodes)) for text, nodes in found.items())

        return dict(self.parsed.view(f"unpad_shared.identifiers {within.type} {within.start_byte} {within.end_byte}",
                                     by_name))

    def _stride_problem(self, declaration: cp.Declaration, depth: int = 0) -> str:
        """"" when every use of the constant is a shared-memory stride or a size; else why not."""
        shared = False
        for use in self._uses(declaration.name, declaration):
            kind = self._use_kind(use, depth)
            if kind.startswith("refuse:"):
                return kind.removeprefix("refuse: ")
            shared |= kind == "shared"
        if depth == 0 and not shared:
            return f"{declaration.name} is not used as a shared-memory row stride"
        return ""

    def _use_kind(self, use: Node, depth: int) -> str:
        line = use.start_point.row + 1
        name = self.text(use)
        ancestor = use.parent
        while ancestor is not None and ancestor.type not in ("function_definition", "translation_unit"):
            if ancestor.type == "static_assert_declaration":
                return "size"
            ancestor = ancestor.parent
        ancestor = use.parent
        while ancestor is not None:
            if ancestor.type == "array_declarator":
                declaration = ancestor
                while declaration is not None and declaration.type != "declaration":
                    declaration = declaration.parent
                if declaration is not None and "__shared__" in self.text(declaration).split("[")[0].split():
                    return "shared"
                return f"refuse: {name} sizes a non-shared array (line {line})"
            if ancestor.type not in _ARITHMETIC:
                break
            ancestor = ancestor.parent
        multiplied = use.parent is not None and use.parent.type == "binary_expression" and operator(use.parent) == "*"
        if not multiplied:
            return f"refuse: {name} is used other than as a row stride (line {line}: `{self._line(use)}`)"
        top = use
        while top.parent is not None and top.parent.type in _ARITHMETIC:
            top = top.parent
            if top.type == "binary_expression" and operator(top) in _TESTS:
                return f"refuse: {name} is used other than as a row stride (line {line}: `{self._line(use)}`)"
        holder = top.parent
        if holder is not None and holder.type == "init_declarator":
            derived = next((d for d in self.scope.declarations if d.init == top), None)
            if derived is not None and derived.constant and depth < 4:
                problem = self._stride_problem(derived, depth + 1)
                return f"refuse: {problem}" if problem else "size"
        spaces = {self.scope.memory_space(leaf) for leaf in cp.nodes_of_type(top, "identifier")}
        if holder is not None and holder.type == "subscript_argument_list":
            spaces.add(self.scope.memory_space(holder.parent.child_by_field_name("argument")))
        if "global" in spaces:
            return f"refuse: {name} is also a global-memory stride (line {line})"
        if "shared" in spaces:
            return "shared"
        return f"refuse: {name} strides memory that cannot be traced to shared memory (line {line})"

    def _line(self, node: Node) -> str:
        start = self.parsed.data.rfind(b"\n", 0, node.start_byte) + 1
        end = self.parsed.data.find(b"\n", node.start_byte)
        return self.parsed.data[start:end if end != -1 else None].decode("utf-8").strip()[:80]

    def _array_problem(self, declaration: cp.Declaration, rank: int) -> str:
        """"" when every use of the array is a full-rank subscript (`tile[r][c]`, `&tile[r][c]`)."""
        for use in self._uses(declaration.name, declaration):
            depth, node = 0, use
            while node.parent is not None and node.parent.type == "subscript_expression" and \
                    node.parent.child_by_field_name("argument") == node:
                depth, node = depth + 1, node.parent
            address = node.parent if node.parent is not None and node.parent.type == "pointer_expression" else None
            # `&tile[r][c]` may go straight to a call (an async copy's address), not into a pointer
            # whose arithmetic could walk across rows.
            kept = address is not None and (address.parent is None or address.parent.type != "argument_list")
            if depth != rank or kept:
                return (f"{declaration.name} is used as a flat pointer or row (line {use.start_point.row + 1}: "
                        f"`{self._line(use)}`): padding is baked into its address arithmetic")
        return ""

    def _alignment_problem(self, site: PadSite) -> str:
        width, pad = self.value(site.width), self.value(site.pad)
        if width is None or pad is None:
            return ""
        if _twos(width) < _twos(width + pad):
            return (f"the unpadded stride {width} is less aligned than the padded {width + pad}: "
                    f"vector accesses of its rows could misalign")
        return ""


def _twos(n: int) -> int:
    return (n & -n).bit_length() - 1 if n else 64


class UnpadShared(Transform):
    name = "unpad_shared"
    intent = ("Pad the row stride of a shared-memory tile by a few elements so that accesses down a column or "
              "across a fragment spread over all banks.")
    role = Role.MECHANISM
    removes = ()

    def find(self, state: KernelState) -> list[Anchor]:
        return [anchor for anchor, _ in self._plans(state) if anchor is not None]

    def _plans(self, state: KernelState) -> list[tuple[Anchor | None, PadSite]]:
        analysis = _Analysis(state)
        plans = []
        for site in analysis.sites():
            if site.problem:
                plans.append((None, site))
                continue
            facts = {"from": analysis.text(site.padded), "to": analysis.text(site.width)}
            anchor = Anchor(site.function, "declaration", make_key(site.head, facts), analysis.text(site.padded))
            plans.append((anchor, site))
        return plans

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        head, facts = payload(anchor.key)
        plans = [p for p in self._plans(state) if p[1].head == head and p[1].function == anchor.function]
        if not plans:
            raise NotApplicable(f"no padded shared-memory stride {head} in {anchor.function}")
        found, site = plans[0]
        if found is None:
            raise NotApplicable(site.problem)
        if facts and payload(found.key)[1] != facts:
            raise NotApplicable(f"the padding of {head} is not the one the anchor records")
        analysis = _Analysis(state)
        source = splice(analysis.parsed.data, [(site.padded.start_byte, site.padded.end_byte,
                                                 analysis.text(site.width))])[0].decode("utf-8")
        return self._result(state, found, source, Direction.BACKWARD, analysis.value(site.pad), analysis.text(site.pad))

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        head, facts = payload(anchor.key)
        if not {"from", "to"} <= set(facts):
            raise NotApplicable(f"anchor {head} does not record the padding to restore")
        parsed = cp.parse(state.source)
        name, _, dim = head.partition("[")
        analysis = _Analysis(state)
        target = None
        for declaration in analysis.scope.declarations:
            if declaration.name != name or (declaration.function or FILE_LOCUS) != anchor.function:
                continue
            if dim:
                extents = analysis._extents(declaration.node, name)
                index = int(dim.rstrip("]"))
                target = unparen(extents[index]) if index < len(extents) else None
            elif declaration.init is not None:
                target = unparen(declaration.init)
            break
        if target is None or parsed.text(target) != facts["to"]:
            raise NotApplicable(f"{head} in {anchor.function} is not the unpadded `{facts['to']}` any more")
        source = splice(parsed.data, [(target.start_byte, target.end_byte, facts["from"])])[0].decode("utf-8")
        padded = _Analysis(KernelState(source=source, plan=state.plan))
        pad_site = next((s for s in padded.sites() if s.head == head), None)
        pad = padded.value(pad_site.pad) if pad_site is not None else None
        return self._result(state, anchor, source, Direction.FORWARD, pad,
                            padded.text(pad_site.pad) if pad_site is not None else "")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """`__shared__` arrays of rank >= 2 whose innermost extent W is unpadded and whose every use
        is a full-rank element subscript that is never addressed (`&tile[r][c]` may feed a vector or
        an async copy that an odd stride misaligns): W becomes `W + P`, P the first whole padding
        the carrier lists (1 when it lists none)."""
        pads = [v for v in self.carrier_values(carrier, "padding")
                if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        pad = pads[0] if pads else 1
        analysis = _Analysis(state)
        padded = {(site.function, site.head) for site in analysis.sites()}
        anchors = []
        for declaration in analysis.scope.declarations:
            if "__shared__" not in declaration.specifiers or len(declaration.dims) < 2:
                continue
            extents = analysis._extents(declaration.node, declaration.name)
            function, head = declaration.function or FILE_LOCUS, f"{declaration.name}[{len(extents) - 1}]"
            if not extents or extents[-1] is None or (function, head) in padded:
                continue
            if analysis._array_problem(declaration, len(extents)) or _addressed(analysis, declaration):
                continue
            width = unparen(extents[-1])
            text = analysis.text(width)
            grown = f"{text} + {pad}" if width.type in ("identifier", "number_literal") else f"({text}) + {pad}"
            anchors.append(Anchor(function, "declaration", make_key(head, {"from": grown, "to": text}),
                                  analysis.text(declaration.node)))
        return anchors

    def _result(self, state: KernelState, anchor: Anchor, source: str, direction: Direction, pad: int | None,
                pad_text: str) -> Rewrite:
        if source == state.source:
            raise NotApplicable(f"{self.name} changed nothing at {anchor}")
        new_state = KernelState(source=source, plan=state.plan)
        carrier = {"padding": pad if pad is not None else pad_text}
        head = payload(anchor.key)[0]
        note = (f"row padding {pad_text} removed from {head}" if direction is Direction.BACKWARD
                else f"row padding {pad_text} restored on {head}")
        return Rewrite(self.name, direction, anchor, new_state, carrier=carrier, note=note)


def _addressed(analysis: _Analysis, declaration: cp.Declaration) -> bool:
    """Whether some use of the array sits under `&` (through its subscripts)."""
    for use in analysis._uses(declaration.name, declaration):
        node = use
        while node.parent is not None and node.parent.type in ("subscript_expression", "parenthesized_expression"):
            node = node.parent
        if node.parent is not None and node.parent.type == "pointer_expression" and \
                analysis.text(node.parent).lstrip().startswith("&"):
            return True
    return False


register(UnpadShared())
