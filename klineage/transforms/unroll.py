"""unroll: remove one `#pragma unroll` (or `#pragma unroll N`) in front of a loop.

Anchor: the enclosing function, kind "loop", key `<index>#<n>:<pragma>` where <index> is the loop's
index variable (the name its initializer declares or assigns; `while`/`do`/`for` for loops
without one), <n> the loop's ordinal among the function's loops over that variable (every loop
counts, with or without a pragma, so the ordinal survives the removal) and <pragma> the pragma's
argument as written (`unroll`, `unroll 4`, `unroll 1`). The pragma text travels in the key, so
`forward` can put it back from the simplified source and the anchor alone; the anchor's snippet
keeps the removed line as it stood, so forward restores its indentation too (without a snippet the
pragma is indented like the loop).

Backward is always correct: an unroll pragma is a hint to the compiler; the loop computes the
same values without it. `#pragma unroll 1` (keep the loop rolled) counts as well: it is a pragma
that controls unrolling, and without it the compiler decides.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from typing import Any

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

_UNROLL = re.compile(r"unroll\b")
_KEY = re.compile(r"^(?P<var>[^#]+)#(?P<n>\d+):(?P<pragma>unroll\b.*)$")


def loop_variable(parsed: cp.ParsedSource, loop: Node) -> str:
    """The index variable of a loop: the name its initializer declares or assigns, else its kind."""
    if loop.type == "for_statement":
        init = loop.child_by_field_name("initializer")
        if init is not None and init.type == "declaration":
            declarator = init.child_by_field_name("declarator")
            while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
                declarator = declarator.child_by_field_name("declarator")
            if declarator is not None:
                return parsed.text(declarator)
        if init is not None and init.type in ("assignment_expression", "comma_expression"):
            left = init.child_by_field_name("left")
            while left is not None and left.type in ("assignment_expression", "comma_expression"):
                left = left.child_by_field_name("left")
            if left is not None and left.type == "identifier":
                return parsed.text(left)
        return "for"
    if loop.type == "for_range_loop":
        declarator = loop.child_by_field_name("declarator")
        return parsed.text(declarator) if declarator is not None and declarator.type == "identifier" else "for"
    return "while" if loop.type == "while_statement" else "do"


def _line_start(data: bytes, offset: int) -> int:
    return data.rfind(b"\n", 0, offset) + 1


class Unroll(Transform):
    name = "unroll"
    intent = "Ask the compiler to unroll a loop with a constant trip count (#pragma unroll)."
    removes = ("unroll_pragma",)

    def _loops(self, parsed: cp.ParsedSource) -> list[tuple[str, str, cp.Loop]]:
        """(function, `<var>#<n>`, loop) for every loop of the file, in source order."""
        counts: dict[tuple[str, str], int] = {}
        found = []
        for loop in cp.loops(parsed):
            function = loop.function or "<file>"
            var = loop_variable(parsed, loop.node)
            n = counts.get((function, var), 0)
            counts[(function, var)] = n + 1
            found.append((function, f"{var}#{n}", loop))
        return found

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function, loop_key, loop in self._loops(parsed):
            if loop.pragma_node is None or not _UNROLL.match(loop.pragma):
                continue
            start = _line_start(parsed.data, loop.pragma_node.start_byte)
            loop_line_end = parsed.data.find(b"\n", loop.node.start_byte)
            snippet = parsed.data[start:loop_line_end if loop_line_end >= 0 else loop.node.end_byte]
            anchors.append(Anchor(function, "loop", f"{loop_key}:{loop.pragma}", snippet.decode("utf-8", "replace")))
        return anchors

    def _site(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[cp.Loop, str]:
        match = _KEY.match(anchor.key) if anchor.kind == "loop" else None
        if match is None:
            raise NotApplicable(f"unroll needs a loop anchor keyed `<index>#<n>:unroll[ N]`, not {anchor}")
        loop_key = f"{match['var']}#{match['n']}"
        for function, key, loop in self._loops(parsed):
            if function == anchor.function and key == loop_key:
                return loop, match["pragma"]
        raise NotApplicable(f"unroll: no loop over '{match['var']}' number {match['n']} in {anchor.function}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        loop, pragma = self._site(parsed, anchor)
        if loop.pragma_node is None or not _UNROLL.match(loop.pragma):
            raise NotApplicable(f"unroll: the loop at {anchor} has no unroll pragma")
        if loop.pragma != pragma:
            raise NotApplicable(f"unroll: the loop at {anchor} has `#pragma {loop.pragma}`, not `#pragma {pragma}`")
        data = parsed.data
        start = _line_start(data, loop.pragma_node.start_byte)
        end = loop.pragma_node.end_byte
        if data[start:loop.pragma_node.start_byte].strip():
            start = loop.pragma_node.start_byte  # not alone on its line (cannot happen for a directive)
        if not data[start:end].endswith(b"\n") and data[end:end + 1] == b"\n":
            end += 1
        source = (data[:start] + data[end:]).decode("utf-8")
        factor = pragma.split(None, 1)[1] if " " in pragma else ""
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            carrier={"unroll": factor or "full"},
                            note=f"removed `#pragma {pragma}` before the loop over {anchor.key.split('#')[0]}")

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        loop, pragma = self._site(parsed, anchor)
        if loop.pragma_node is not None:
            raise NotApplicable(f"unroll: the loop at {anchor} already has `#pragma {loop.pragma}`")
        data = parsed.data
        at = _line_start(data, loop.node.start_byte)
        if data[at:loop.node.start_byte].strip():
            raise NotApplicable(f"unroll: the loop at {anchor} does not start its line; a pragma cannot go before it")
        indent = data[at:loop.node.start_byte].decode("utf-8")
        first = anchor.snippet.split("\n", 1)[0]
        if first.strip() and re.fullmatch(r"\s*#\s*pragma\s+" + re.escape(pragma) + r"\s*", first):
            line = first + "\n"  # the line as it stood before backward
        else:
            line = f"{indent}#pragma {pragma}\n"
        source = (data[:at] + line.encode("utf-8") + data[at:]).decode("utf-8")
        factor = pragma.split(None, 1)[1] if " " in pragma else ""
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"unroll": factor or "full"},
                            note=f"added `#pragma {pragma}` before the loop over {anchor.key.split('#')[0]}")

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        """Loops without a pragma whose trip count is a constant of at most MAX_FULL_UNROLL (their
        bounds and step are literals or namespace constants). The pragma: full unroll when the
        carrier lists "full" (or lists nothing), else `unroll N` with the first factor it lists."""
        factors = [str(v) for v in self.carrier_values(carrier, "unroll")]
        pragma = "unroll" if not factors or "full" in factors else f"unroll {factors[0]}"
        parsed = cp.parse(state.source)
        constants = state.constants
        anchors = []
        for function, loop_key, loop in self._loops(parsed):
            if loop.pragma_node is not None or loop.node.type != "for_statement":
                continue
            trips = _trip_count(parsed, loop.node, loop_key.split("#")[0], constants)
            if trips is None or not 2 <= trips <= MAX_FULL_UNROLL:
                continue
            line_end = parsed.data.find(b"\n", loop.node.start_byte)
            snippet = parsed.data[loop.node.start_byte:line_end if line_end >= 0 else loop.node.end_byte]
            anchors.append(Anchor(function, "loop", f"{loop_key}:{pragma}", snippet.decode("utf-8", "replace")))
        return anchors


MAX_FULL_UNROLL = 64  # longer constant loops are left to the compiler's own judgement
_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "!=": operator.ne}
_STEP = {"+=": operator.add, "-=": operator.sub, "*=": operator.mul, "<<=": operator.lshift, ">>=": operator.rshift}


def _constant(parsed: cp.ParsedSource, node: Node | None, constants: dict[str, Any]) -> int | None:
    """The integer value of a C expression of literals and namespace constants, else None."""
    if node is None:
        return None
    text = re.sub(r"(?<![\w.])(\d+)[uUlL]+\b", r"\1", parsed.text(node))
    try:
        return expr.evaluate_int(re.sub(r"(?<!/)/(?!/)", "//", text), constants)
    except ExpressionError:
        return None


def _trip_count(parsed: cp.ParsedSource, loop: Node, var: str, constants: dict[str, Any]) -> int | None:
    """How many times `for (var = a; var OP b; var STEP c)` runs with constant a, b, c; None when it
    is not of that form or runs more than 1024 times."""
    init, condition = loop.child_by_field_name("initializer"), loop.child_by_field_name("condition")
    update = loop.child_by_field_name("update")
    start = None
    if init is not None and init.type == "declaration":
        declarators = init.children_by_field_name("declarator")
        if len(declarators) == 1 and declarators[0].type == "init_declarator":
            start = _constant(parsed, declarators[0].child_by_field_name("value"), constants)
    elif init is not None and init.type == "assignment_expression" and parsed.text(init.child_by_field_name(
            "operator")) == "=":
        start = _constant(parsed, init.child_by_field_name("right"), constants)
    if start is None or condition is None or update is None:
        return None
    if condition.type == "condition_clause" and condition.named_child_count == 1:
        condition = condition.named_children[0]
    if condition.type != "binary_expression" or parsed.text(condition.child_by_field_name("left")) != var:
        return None
    compare = _COMPARE.get(parsed.text(condition.child_by_field_name("operator")))
    bound = _constant(parsed, condition.child_by_field_name("right"), constants)
    if update.type == "update_expression":
        step_op, step = (operator.add if "++" in parsed.text(update) else operator.sub), 1
        if parsed.text(update.child_by_field_name("argument")) != var:
            return None
    elif update.type == "assignment_expression" and parsed.text(update.child_by_field_name("left")) == var:
        step_op = _STEP.get(parsed.text(update.child_by_field_name("operator")))
        step = _constant(parsed, update.child_by_field_name("right"), constants)
    else:
        return None
    if compare is None or bound is None or step_op is None or step is None:
        return None
    value, trips = start, 0
    while compare(value, bound):
        trips += 1
        if trips > 1024:
            return None
        value = step_op(value, step)
    return trips


register(Unroll())
