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

import re

from tree_sitter import Node

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


register(Unroll())
