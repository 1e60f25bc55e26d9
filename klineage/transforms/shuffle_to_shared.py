"""shuffle_to_shared: a warp-shuffle reduction (or scan) becomes the same exchange through a shared
scratch row per warp, separated by `__syncwarp`.

Sites: a loop whose body (not counting inner loops) exchanges values with `__shfl_xor_sync` /
`__shfl_down_sync` / `__shfl_up_sync` at an offset that depends on the loop variable (the butterfly
`for (offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset);`, the down-shift
reduction, the up-shift scan), or an unrolled run of two or more consecutive statements that shuffle
at constant offsets. Indexed `__shfl_sync` calls inside such a site are converted too, but do not make
one (a broadcast or gather, such as scalarize_mma's operand fetches, is not a reduction).

Every shuffle statement `S(__shfl_X_sync(M, V, O))` becomes

    row[lane] = V;            // publish this lane's value
    __syncwarp(M);
    S(<partner's slot>)       // xor: *(row + ((thread ^ O) & 31)); down: row[lane + O < 32 ? lane + O : lane];
    __syncwarp(M);            // up: row[lane >= O ? lane - O : lane]; idx: row[O & 31]

(the second __syncwarp keeps a lane from overwriting a slot before its reader has read it), so each
lane combines exactly the operands it combined before, in the same order, with the same operator:
the results are bit-identical, and the lanes that receive the result are the same (all of them for
the xor butterfly, lane 0 for the down-shift, lane l the prefix of lanes 0..l for the up-scan). The
xor partner is written with the thread index and pointer arithmetic so that it does not read as an
XOR-swizzled shared layout (see `_exchange`).

The scratch is `__shared__ T scratch[32][32]`: one row of 32 slots per warp, indexed by the warp's
index in the block, for up to 32 warps (the hardware's 1024 threads per block), so warps never share
a slot and the size stays right whatever the plan's block size becomes. It costs 32 * 32 * sizeof(T)
bytes of static shared memory per site and shuffled type (4 KiB for float).

Anchor: the enclosing function and the site's ordinal among its shuffle sites (`shuffle#0`; the
ordinal counts rewritten sites too, so it survives rewrites), kind `loop` or `statements`. Forward
removes the scratch and puts the shuffle calls back, byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._asm import function_node, lane_expression, thread_index, warp_expression
from klineage.transforms._edit import indentation
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

_KINDS = {"__shfl_xor_sync": "xor", "__shfl_down_sync": "down", "__shfl_up_sync": "up", "__shfl_sync": "idx"}
_STATEMENTS = ("expression_statement", "declaration")
_SIMPLE = ("identifier", "number_literal")
_IMPURE = ("call_expression", "assignment_expression", "update_expression")
_COMMENT = "// shuffle_to_shared scratch: a 32-slot row per warp"
_BRACED = "; loop body braced"
_SCRATCH = re.compile(r"^shfl_scratch(?P<n>\d+)(?:_(?P<j>\d+))?$")
WARP_SLOTS = 32


@dataclass
class _Site:
    kind: str  # "loop", "statements", or "scratch" (the rewritten form)
    start: int
    loop: Node | None = None  # the loop ("loop")
    statements: list[Node] = field(default_factory=list)  # the run ("statements") or the declarations ("scratch")


@dataclass(frozen=True)
class _Shuffle:
    statement: Node  # the statement holding the call
    call: Node
    kind: str  # xor, down, up, idx
    mask: Node
    value: Node
    offset: Node


def _calls(node: Node) -> list[Node]:
    return [c for c in cp.nodes_of_type(node, "call_expression") if cp.call_name(c) in _KINDS]


_LOOP_TYPES = ("for_statement", "while_statement", "do_statement", "for_range_loop")


def _own_calls(loop: Node) -> list[Node]:
    """The shuffle calls in a loop's body that no inner loop encloses (those belong to the inner loop)."""
    def nearest_loop(node: Node) -> Node | None:
        node = node.parent
        while node is not None and node.type not in _LOOP_TYPES:
            node = node.parent
        return node

    body = loop.child_by_field_name("body")
    return [c for c in _calls(body) if nearest_loop(c) == loop] if body is not None else []


def _loop_variables(parsed: cp.ParsedSource, loop: Node) -> set[str]:
    init = loop.child_by_field_name("initializer")
    if init is None:
        return set()
    if init.type == "declaration":
        return {d.name for d in cp.declarations(parsed) if d.node == init}
    return {parsed.text(n) for n in cp.nodes_of_type(init, "identifier")
            if n.parent is not None and n.parent.type == "assignment_expression"
            and n.parent.child_by_field_name("left") == n}


def _names(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.nodes_of_type(node, "identifier")}


def _statement_of(node: Node) -> Node | None:
    while node is not None and node.type not in _STATEMENTS + ("return_statement", "if_statement", "for_statement",
                                                               "while_statement", "do_statement", "compound_statement"):
        node = node.parent
    return node


def _line_start(parsed: cp.ParsedSource, node: Node) -> int:
    return node.start_byte - node.start_point.column


def _site_node(node: Node) -> Node:
    """The loop, or the `#pragma` line right before it (the insertion point of the scratch)."""
    previous = node.prev_named_sibling
    if previous is not None and cp.pragma_text(previous) and previous.end_point.row + 1 >= node.start_point.row:
        return previous
    return node


class ShuffleToShared(Transform):
    name = "shuffle_to_shared"
    intent = ("Exchange values between the lanes of a warp with register shuffles (__shfl_*_sync) instead of "
              "a per-warp shared-memory scratch row separated by __syncwarp.")
    removes = ("shfl",)
    adds = ("shared_array", "syncwarp", "sts", "lds")
    after = ()

    # -- sites -------------------------------------------------------------------------------------

    def _sites(self, parsed: cp.ParsedSource, function: Node) -> list[_Site]:
        sites: list[_Site] = []
        taken: list[Node] = []
        for loop in cp.loops(parsed):
            if loop.function != cp.function_name(function) or cp.enclosing_function(loop.node) != function:
                continue
            variables = _loop_variables(parsed, loop.node)
            body = loop.node.child_by_field_name("body")
            if body is None or not variables:
                continue
            if any(cp.call_name(c) != "__shfl_sync" and _names(parsed, c.child_by_field_name("arguments")) & variables
                   for c in _own_calls(loop.node)):
                sites.append(_Site("loop", _site_node(loop.node).start_byte, loop=loop.node))
                taken.append(loop.node)
        for block in cp.nodes_of_type(function, "compound_statement"):
            run: list[Node] = []
            for child in block.named_children + [None]:
                inside = child is not None and any(t.start_byte <= child.start_byte < t.end_byte for t in taken)
                if child is not None and child.type == "comment":
                    continue
                if child is not None and not inside and child.type in _STATEMENTS and self._constant_shuffle(
                        parsed, child):
                    run.append(child)
                    continue
                if len(run) >= 2:
                    sites.append(_Site("statements", run[0].start_byte, statements=run))
                run = []
        for declaration in cp.declarations(parsed):
            match = _SCRATCH.match(declaration.name)
            if match and not match.group("j") and "__shared__" in declaration.specifiers \
                    and cp.enclosing_function(declaration.node) == function:
                sites.append(_Site("scratch", declaration.node.start_byte, statements=[declaration.node]))
        return sorted(sites, key=lambda s: s.start)

    @staticmethod
    def _constant_shuffle(parsed: cp.ParsedSource, statement: Node) -> bool:
        calls = _calls(statement)
        if len(calls) != 1:
            return False
        args = calls[0].child_by_field_name("arguments").named_children
        return len(args) >= 3 and args[2].type == "number_literal"

    def _site_kind(self, parsed: cp.ParsedSource, site: _Site) -> str:
        if site.kind != "scratch":
            return site.kind
        return "loop" if self._scratch_region(parsed, site)[0] == "loop" else "statements"

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function in cp.functions(parsed):
            for i, site in enumerate(self._sites(parsed, function.node)):
                if site.kind == "scratch":
                    continue
                first = site.loop if site.loop is not None else site.statements[0]
                snippet = next((parsed.text(c) for c in _calls(first)), "")
                anchors.append(Anchor(function.name, site.kind, f"shuffle#{i}", snippet))
        return anchors

    def _site(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[int, _Site]:
        function = function_node(parsed, anchor.function)
        name, _, number = anchor.key.partition("#")
        if name != "shuffle" or not number.isdigit():
            raise NotApplicable(f"anchor key {anchor.key!r} is not shuffle#<n>")
        sites = self._sites(parsed, function)
        index = int(number)
        if index >= len(sites):
            raise NotApplicable(f"{anchor.function} has no shuffle site #{index} (it has {len(sites)})")
        site = sites[index]
        kind = self._site_kind(parsed, site)
        if kind != anchor.kind:
            raise NotApplicable(f"shuffle site #{index} of {anchor.function} is a {kind}, not a {anchor.kind}")
        return index, site

    # -- backward ----------------------------------------------------------------------------------

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        index, site = self._site(parsed, anchor)
        if site.kind == "scratch":
            raise NotApplicable(f"the shuffles at {anchor} already go through shared memory")
        function = function_node(parsed, anchor.function)
        region = site.loop if site.loop is not None else None
        shuffles = self._shuffles(parsed, site)
        types = self._types(parsed, function, shuffles, site.start)
        ordered = list(dict.fromkeys(types[s.call.id] for s in shuffles))
        scratch = {t: f"shfl_scratch{index}" + (f"_{j}" if j else "") for j, t in enumerate(ordered)}
        rows = {t: f"shfl_row{index}" + (f"_{j}" if j else "") for j, t in enumerate(ordered)}
        lane = f"shfl_lane{index}"
        taken = _names(parsed, function) | {parsed.text(n) for n in cp.nodes_of_type(function, "type_identifier")}
        clash = taken & (set(scratch.values()) | set(rows.values()) | {lane})
        if clash:
            raise NotApplicable(f"names {sorted(clash)} are already used in {anchor.function}")

        edits: list[tuple[int, int, str]] = []
        body = region.child_by_field_name("body") if region is not None else None
        braced = body is not None and body.type != "compound_statement"
        for shuffle in shuffles:
            row = rows[types[shuffle.call.id]]
            edits += self._exchange(parsed, shuffle, row, lane, thread_index(state), body if braced else None,
                                    region)
        first = _site_node(region) if region is not None else site.statements[0]
        indent = indentation(parsed.data, (region if region is not None else first).start_byte)
        if parsed.data[_line_start(parsed, first):first.start_byte].strip():
            raise NotApplicable(f"the shuffle site at {anchor} does not start its line")
        lines = []
        for t in ordered:
            comment = _COMMENT + (_BRACED if braced and t == ordered[0] else "")
            lines.append(f"{indent}__shared__ {t} {scratch[t]}[{WARP_SLOTS}][32];  {comment}")
            lines.append(f"{indent}{t}* const {rows[t]} = {scratch[t]}[{warp_expression(state)}];")
        lines.append(f"{indent}const int {lane} = {lane_expression(state)};")
        edits.append((_line_start(parsed, first), _line_start(parsed, first), "\n".join(lines) + "\n"))
        source = _apply(parsed, edits)
        kinds = sorted({s.kind for s in shuffles})
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{len(shuffles)} {'/'.join(kinds)} shuffles -> exchanges through a "
                                 f"{WARP_SLOTS}x32 shared scratch ({', '.join(ordered)})")

    def _shuffles(self, parsed: cp.ParsedSource, site: _Site) -> list[_Shuffle]:
        calls = _own_calls(site.loop) if site.loop is not None else [c for n in site.statements for c in _calls(n)]
        found = []
        for call in calls:
            name = cp.call_name(call)
            args = call.child_by_field_name("arguments").named_children
            if len(args) != 3:
                raise NotApplicable(f"{name} with a width argument is not supported: {parsed.text(call)}")
            statement = _statement_of(call)
            if statement is None or statement.type not in _STATEMENTS:
                raise NotApplicable(f"{parsed.text(call)} is not in a plain statement "
                                    f"({statement.type if statement is not None else 'none'})")
            parent = statement.parent
            in_body = site.loop is not None and (
                statement == site.loop.child_by_field_name("body")
                or parent == site.loop.child_by_field_name("body"))
            in_run = site.loop is None and statement in site.statements
            if not (in_body or in_run):
                raise NotApplicable(f"{parsed.text(call)} is not a statement of the loop body itself "
                                    "(a conditional or nested shuffle)")
            if len(_calls(statement)) != 1:
                raise NotApplicable(f"a statement with several shuffles: {parsed.text(statement)}")
            mask, value, offset = args
            for part, what in ((mask, "mask"), (value, "value"), (offset, "offset")):
                if cp.nodes_of_type(part, *_IMPURE):
                    raise NotApplicable(f"the shuffle's {what} {parsed.text(part)} is not a plain expression")
            found.append(_Shuffle(statement, call, _KINDS[name], mask, value, offset))
        if not found:
            raise NotApplicable("no shuffle at this site")
        return found

    @staticmethod
    def _types(parsed: cp.ParsedSource, function: Node, shuffles: list[_Shuffle], before: int) -> dict[int, str]:
        """The declared type of each shuffled value (a parameter or a local declared before the site)."""
        declared: dict[str, tuple[str, int]] = {}  # name -> (type, how many subscripts reach an element)
        declarator = function.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        parameters = declarator.child_by_field_name("parameters") if declarator is not None else None
        for parameter in parameters.named_children if parameters is not None else []:
            type_node = parameter.child_by_field_name("type")
            if parameter.type != "parameter_declaration" or type_node is None:
                continue
            inner, stars, dims = parameter.child_by_field_name("declarator"), 0, 0
            while inner is not None and inner.type != "identifier":
                stars += inner.type == "pointer_declarator"
                dims += inner.type == "array_declarator"
                inner = inner.child_by_field_name("declarator") or (
                    inner.named_children[-1] if inner.named_children else None)
            if inner is not None:
                declared[parsed.text(inner)] = (parsed.text(type_node), stars + dims)
        for declaration in cp.declarations(parsed):
            if cp.enclosing_function(declaration.node) == function and declaration.node.start_byte < before:
                levels = declaration.indirection.count("*") + len(declaration.dims)
                declared[declaration.name] = (declaration.type, levels)
        types = {}
        for shuffle in shuffles:
            value, subscripts = shuffle.value, 0
            while value.type == "subscript_expression":  # x[i]: the element type of x
                value, subscripts = value.child_by_field_name("argument"), subscripts + 1
            name = parsed.text(value)
            if value.type != "identifier" or name not in declared:
                raise NotApplicable(f"cannot tell the type of the shuffled value {parsed.text(shuffle.value)} "
                                    "(only a named variable or an element of a named array)")
            base, levels = declared[name]
            if base in ("auto", "decltype") or levels < subscripts:
                raise NotApplicable(f"cannot tell the type of the shuffled value {parsed.text(shuffle.value)}")
            types[shuffle.call.id] = base + "*" * (levels - subscripts)
        return types

    @staticmethod
    def _exchange(parsed: cp.ParsedSource, shuffle: _Shuffle, row: str, lane: str, thread: str,
                  braceless_body: Node | None, loop: Node | None) -> list[tuple[int, int, str]]:
        mask, value = parsed.text(shuffle.mask), parsed.text(shuffle.value)
        offset = parsed.text(shuffle.offset)
        o = offset if shuffle.offset.type in _SIMPLE else f"({offset})"
        source = {
            "xor": f"({thread} ^ {o}) & 31",
            "down": f"{lane} + {o} < 32 ? {lane} + {o} : {lane}",
            "up": f"{lane} >= {o} ? {lane} - {o} : {lane}",
            "idx": f"{o} & 31",
        }[shuffle.kind]
        statement = shuffle.statement
        start, end = statement.start_byte, statement.end_byte
        # The xor partner, (thread ^ offset) & 31, is read through pointer arithmetic rather than a
        # subscript, and XORs the thread index rather than the lane (threadIdx.x & 31): a shared-array
        # subscript built with `^`, or an XOR with an `x & C` operand, reads as an XOR-swizzled layout
        # (the `xor_swizzle` source feature; unswizzle_shared would drop the XOR), and a butterfly
        # exchange is not a layout.
        slot = f"*({row} + ({source}))" if shuffle.kind == "xor" else f"{row}[{source}]"
        read = (parsed.data[start:shuffle.call.start_byte].decode() + slot
                + parsed.data[shuffle.call.end_byte:end].decode())
        if braceless_body is not None:  # `for (...) S;` -> `for (...) { ...; S'; ... }`
            own_line = not parsed.data[_line_start(parsed, statement):start].strip()
            outer = indentation(parsed.data, (statement if own_line else loop).start_byte)
            inner = outer + "    "
            text = (f"{{\n{inner}{row}[{lane}] = {value};\n{inner}__syncwarp({mask});\n{inner}{read}\n"
                    f"{inner}__syncwarp({mask});\n{outer}}}")
            return [(start, end, text)]
        indent = indentation(parsed.data, statement.start_byte)
        text = f"{row}[{lane}] = {value};\n{indent}__syncwarp({mask});\n{indent}{read}\n{indent}__syncwarp({mask});"
        return [(start, end, text)]

    # -- forward -----------------------------------------------------------------------------------

    def _scratch_region(self, parsed: cp.ParsedSource, site: _Site) -> tuple[str, list[Node], list[Node]]:
        """("loop" | "statements", the scratch declarations, the statements or loop that use them)."""
        declarations = [site.statements[0]]
        node = site.statements[0].next_named_sibling
        while node is not None and node.type in ("declaration", "comment"):
            if node.type == "declaration":
                names = {d.name for d in cp.declarations(parsed) if d.node == node}
                if not any(n.startswith(("shfl_scratch", "shfl_row", "shfl_lane")) for n in names):
                    break
                declarations.append(node)
            node = node.next_named_sibling
        while node is not None and (node.type == "comment" or cp.pragma_text(node)):
            node = node.next_named_sibling
        if node is not None and node.type in ("for_statement", "while_statement", "do_statement"):
            return "loop", declarations, [node]
        return "statements", declarations, [node] if node is not None else []

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        index, site = self._site(parsed, anchor)
        if site.kind != "scratch":
            raise NotApplicable(f"{anchor} already exchanges through shuffles")
        kind, declarations, region = self._scratch_region(parsed, site)
        rows = set()
        lane = f"shfl_lane{index}"
        for declaration in cp.declarations(parsed):
            if declaration.node in declarations and declaration.name.startswith("shfl_row"):
                rows.add(declaration.name)
        if not rows or not region:
            raise NotApplicable(f"the scratch of {anchor} has no rows or nothing that uses them")
        braced = _BRACED in parsed.text(declarations[0].next_sibling) if declarations[0].next_sibling else False
        edits: list[tuple[int, int, str]] = []
        groups = 0
        scope = region if kind == "loop" else []
        if kind == "statements":  # the run: consecutive exchange groups right after the declarations
            node = region[0]
            while node is not None and self._publish(parsed, node, rows, lane):
                edits.append(self._restore(parsed, node, rows, lane, None))
                groups += 1
                for _ in range(4):
                    node = node.next_named_sibling if node is not None else None
        for container in scope:
            for statement in cp.nodes_of_type(container, "expression_statement"):
                if self._publish(parsed, statement, rows, lane):
                    block = statement.parent if braced else None
                    edits.append(self._restore(parsed, statement, rows, lane, block))
                    groups += 1
        if not groups:
            raise NotApplicable(f"no shared-memory exchange found after the scratch of {anchor}")
        first, last = declarations[0], declarations[-1]
        end = last.end_byte
        comment = last.next_sibling
        if comment is not None and comment.type == "comment" and comment.start_point.row == last.end_point.row:
            end = comment.end_byte
        if parsed.data[end:end + 1] == b"\n":
            end += 1
        edits.append((_line_start(parsed, first), end, ""))
        return self.rewrite(state, anchor, Direction.FORWARD, _apply(parsed, edits),
                            note=f"{groups} shared-memory exchanges -> warp shuffles")

    @staticmethod
    def _publish(parsed: cp.ParsedSource, statement: Node, rows: set[str], lane: str) -> bool:
        """`row[lane] = V;`, the first statement of an exchange group."""
        if statement is None or statement.type != "expression_statement" or not statement.named_children:
            return False
        assignment = statement.named_children[0]
        if assignment.type != "assignment_expression" or parsed.text(assignment.child_by_field_name("operator")) != "=":
            return False
        target = assignment.child_by_field_name("left")
        return target.type == "subscript_expression" and parsed.text(target.child_by_field_name("argument")) in rows \
            and parsed.text(target.child_by_field_name("indices")) == f"[{lane}]"

    def _restore(self, parsed: cp.ParsedSource, publish: Node, rows: set[str], lane: str,
                 block: Node | None) -> tuple[int, int, str]:
        sync1 = publish.next_named_sibling
        statement = sync1.next_named_sibling if sync1 is not None else None
        sync2 = statement.next_named_sibling if statement is not None else None
        if sync2 is None or not all(self._syncwarp(parsed, s) for s in (sync1, sync2)):
            raise NotApplicable(f"exchange group at line {publish.start_point.row + 1} is not "
                                "row[lane] = v; __syncwarp(m); use; __syncwarp(m);")
        assignment = publish.named_children[0]
        row = parsed.text(assignment.child_by_field_name("left").child_by_field_name("argument"))
        value = parsed.text(assignment.child_by_field_name("right"))
        mask = parsed.text(sync1.named_children[0].child_by_field_name("arguments").named_children[0])
        reads = [(s, s.child_by_field_name("indices").named_children[0], "subscript")
                 for s in cp.nodes_of_type(statement, "subscript_expression")
                 if parsed.text(s.child_by_field_name("argument")) == row
                 and s.child_by_field_name("indices").named_children]
        for deref in cp.nodes_of_type(statement, "pointer_expression"):  # *(row + (lane ^ o))
            inner = deref.child_by_field_name("argument")
            sum_ = inner.named_children[0] if inner.type == "parenthesized_expression" else None
            if parsed.text(deref.child_by_field_name("operator")) == "*" and sum_ is not None \
                    and sum_.type == "binary_expression" and parsed.text(sum_.child_by_field_name("left")) == row:
                index = sum_.child_by_field_name("right")
                reads.append((deref, index.named_children[0] if index.type == "parenthesized_expression" else index,
                              "pointer"))
        if len(reads) != 1 or row not in rows:
            raise NotApplicable(f"exchange group at line {publish.start_point.row + 1} reads its row "
                                f"{len(reads)} times")
        read, index, form = reads[0]
        kind, offset = self._source(parsed, index, lane, form)
        call = f"__shfl_{kind}_sync({mask}, {value}, {offset})" if kind != "idx" else \
            f"__shfl_sync({mask}, {value}, {offset})"
        text = (parsed.data[statement.start_byte:read.start_byte].decode() + call
                + parsed.data[read.end_byte:statement.end_byte].decode())
        if block is not None:
            return block.start_byte, block.end_byte, text
        return publish.start_byte, sync2.end_byte, text

    @staticmethod
    def _syncwarp(parsed: cp.ParsedSource, statement: Node) -> bool:
        if statement.type != "expression_statement" or not statement.named_children:
            return False
        call = statement.named_children[0]
        return call.type == "call_expression" and cp.call_name(call) == "__syncwarp" \
            and len(call.child_by_field_name("arguments").named_children) == 1

    @staticmethod
    def _source(parsed: cp.ParsedSource, index: Node | None, lane: str, form: str) -> tuple[str, str]:
        """(kind, offset text) from the source-slot expression this transform writes."""

        def operand(node: Node) -> str:
            if node.type == "parenthesized_expression" and node.named_children \
                    and node.named_children[0].type not in _SIMPLE:
                return parsed.text(node.named_children[0])
            return parsed.text(node)

        if index is not None and index.type == "binary_expression" \
                and parsed.text(index.child_by_field_name("operator")) == "&" \
                and parsed.text(index.child_by_field_name("right")) == "31":
            left = index.child_by_field_name("left")
            if form == "subscript":  # row[(o) & 31]
                return "idx", operand(left)
            xor = left.named_children[0] if left.type == "parenthesized_expression" else None
            if xor is not None and xor.type == "binary_expression" \
                    and parsed.text(xor.child_by_field_name("operator")) == "^":  # *(row + ((thread ^ o) & 31))
                return "xor", operand(xor.child_by_field_name("right"))
        if index is not None and index.type == "conditional_expression":
            consequence = index.child_by_field_name("consequence")
            if consequence is not None and consequence.type == "binary_expression" \
                    and parsed.text(consequence.child_by_field_name("left")) == lane:
                op = parsed.text(consequence.child_by_field_name("operator"))
                if op in ("+", "-"):
                    return ("down" if op == "+" else "up"), operand(consequence.child_by_field_name("right"))
        raise NotApplicable(f"unrecognised scratch slot {parsed.text(index) if index is not None else ''!r}")


def _apply(parsed: cp.ParsedSource, edits: list[tuple[int, int, str]]) -> str:
    data = parsed.data
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        data = data[:start] + text.encode("utf-8") + data[end:]
    return data.decode("utf-8")


register(ShuffleToShared())
