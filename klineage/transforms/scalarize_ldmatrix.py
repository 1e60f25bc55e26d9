"""scalarize_ldmatrix: an `ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16` helper becomes plain
shared-memory loads that give every lane exactly the registers ldmatrix would.

ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): the warp loads 1, 2 or 4 matrices
of 8 x 8 16-bit elements; lanes 8 j .. 8 j + 7 supply the shared-memory addresses of the 8 rows of
matrix j (16 contiguous bytes each), and register j of lane l receives

- without .trans: row l / 4 of matrix j, elements 2 (l % 4) and 2 (l % 4) + 1 (one 32-bit word);
- with .trans: element l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 of matrix j (the transposed
  fragment), the first in the low 16 bits.

A lane therefore needs row addresses held by other lanes; the scalar form fetches them with
`__shfl_sync` (a different mechanism, and as warp-synchronous as ldmatrix itself: every lane of the
warp must execute it, which ldmatrix's `.sync.aligned` already demands), then reads one 32-bit word
(or two 16-bit halves for .trans) through `__cvta_shared_to_generic`, which nvcc lowers to LDS.

The asm statement is replaced in place by a marker comment (the PTX with its C operands, from which
the forward direction rebuilds the asm in canonical form) and a block with the scalar code; the rest
of the helper is untouched. Where the expert wrote the statement otherwise than the canonical layout
(its template string split elsewhere, operands aligned differently, `=&r` outputs, ...), the marker
also records the statement verbatim and forward restores that text, so that forward(backward(x)) is
x byte for byte (see `VERBATIM`). Anchor: the helper function's name (`name#i` for the i-th of
several ldmatrix statements in one helper).

This module also holds the small helpers its sibling transforms (`scalarize_mma`,
`shuffle_to_shared`) share: reading an inline-asm statement, the canonical asm layout, the lane
expressions and identifier checks.
"""

from __future__ import annotations

import re

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._asm import (
    FULL_MASK,
    LINE_WIDTH,
    asm_anchors,
    asm_site,
    check_names,
    lane_expression,
    marker_groups,
    marker_line,
    operand_groups,
    read_asm,
    render_asm,
    restore_marked,
    verbatim_lines,
    wrap,
)
from klineage.transforms._edit import indentation, splice
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

# ---------------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# The transform
# ---------------------------------------------------------------------------------------------------

_OPCODE = re.compile(r"ldmatrix\.sync\.aligned\.m8n8\.x(?P<num>[124])(?P<trans>\.trans)?\.shared(?:::cta)?\.b16")
_LOCALS = {"ldsm_addr", "ldsm_lane", "ldsm_src", "ldsm_col"} | {f"ldsm_{h}{j}" for h in ("lo", "hi") for j in range(4)}


class ScalarizeLdmatrix(Transform):
    name = "scalarize_ldmatrix"
    intent = ("Load warp-wide MMA operand fragments from shared memory with ldmatrix, one instruction placing "
              "up to four 8x8 16-bit matrices straight into the fragment layout, instead of per-lane 32-bit "
              "loads from row addresses fetched with shuffles.")
    removes = ("ldmatrix", "ldsm")
    adds = ("shfl", "lds")
    after = ()

    def find(self, state: KernelState) -> list[Anchor]:
        return asm_anchors(cp.parse(state.source), "ldmatrix")

    # -- backward ----------------------------------------------------------------------------------

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site = asm_site(parsed, "ldmatrix", anchor)
        if site.asm is None:
            raise NotApplicable(f"the ldmatrix at {anchor} is already scalar")
        asm = read_asm(parsed, site.asm)
        match, groups = operand_groups(asm, _OPCODE)
        count = int(match.group("num"))
        trans = bool(match.group("trans"))
        if len(groups) != 2 or len(groups[0]) != count or len(groups[1]) != 1:
            raise NotApplicable(f"ldmatrix .x{count} needs {{{count} registers}}, [address]")
        registers, (address,) = groups
        if registers != list(range(count)) or address != count or len(asm.operands) != count + 1:
            raise NotApplicable("ldmatrix operands are not the outputs %0.. followed by the address")
        for constraint, text in asm.outputs:
            if constraint not in ("=r", "=&r"):
                raise NotApplicable(f"ldmatrix output {text} has constraint {constraint!r}, not \"=r\"")
        if asm.inputs[0][0] != "r":
            raise NotApplicable(f"the ldmatrix address {asm.inputs[0][1]} is not a 32-bit shared address (\"r\"); "
                                "64-bit addresses are not supported")
        check_names(parsed, asm.operand_nodes, _LOCALS, "scalarize_ldmatrix")

        indent = indentation(parsed.data, asm.statement.start_byte)
        outputs = [text for _, text in asm.outputs]
        opcode = asm.instruction.split(" ", 1)[0]
        operands = f"{{{', '.join(outputs)}}}, [{asm.inputs[0][1]}]"
        # What forward will render from this marker; a statement laid out otherwise is recorded verbatim.
        canonical = self.canonical_asm(indent, asm.keyword, opcode, marker_groups(operands), asm.clobbers)
        verbatim = verbatim_lines(parsed, asm, indent, canonical)
        text = (marker_line(asm, opcode, operands, indent, verbatim) + "\n"
                + self._scalar_block(state, indent, outputs, asm.inputs[0][1], trans))
        source = splice(parsed.data, [(asm.statement.start_byte, asm.statement.end_byte, text)])[0].decode("utf-8")
        note = (f"ldmatrix .x{count}{' .trans' if trans else ''} -> {count * (2 if trans else 1)} shuffles of row "
                f"addresses and {count * (2 if trans else 1)} {'16' if trans else '32'}-bit shared loads per lane")
        return self.rewrite(state, anchor, Direction.BACKWARD, source, note=note)

    @staticmethod
    def _scalar_block(state: KernelState, indent: str, outputs: list[str], address: str, trans: bool) -> str:
        inner = indent + "    "
        lines = [f"{indent}{{"]
        if trans:
            lines += [
                f"{inner}// .trans: lane l receives element l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 of matrix j",
                f"{inner}// (16 bits each, the first row in the low half); lanes 8 j + 2 (l % 4) and",
                f"{inner}// 8 j + 2 (l % 4) + 1 hold those two row addresses.",
            ]
        else:
            lines += [
                f"{inner}// Lane l receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1, of matrix j (one "
                "32-bit word);",
                f"{inner}// lane 8 j + l / 4 holds that row's address.",
            ]
        lines += [f"{inner}const unsigned ldsm_addr = {address};",
                  f"{inner}const int ldsm_lane = {lane_expression(state)};"]
        if trans:
            lines += [f"{inner}const int ldsm_src = 2 * (ldsm_lane & 3);",
                      f"{inner}const unsigned ldsm_col = 2u * (ldsm_lane >> 2);"]
        else:
            lines += [f"{inner}const int ldsm_src = ldsm_lane >> 2;",
                      f"{inner}const unsigned ldsm_col = 4u * (ldsm_lane & 3);"]
        for j, target in enumerate(outputs):
            base = f"{8 * j} + ldsm_src" if j else "ldsm_src"
            if trans:
                for half, src in (("lo", base), ("hi", f"{base} + 1")):
                    load = (f"const unsigned ldsm_{half}{j} = *static_cast<const unsigned short*>("
                            f"__cvta_shared_to_generic(__shfl_sync({FULL_MASK}, ldsm_addr, {src}) + ldsm_col));")
                    lines.append(wrap(load, LINE_WIDTH, inner))
                lines.append(f"{inner}{target} = ldsm_lo{j} | (ldsm_hi{j} << 16);")
            else:
                load = (f"{target} = *static_cast<const unsigned*>("
                        f"__cvta_shared_to_generic(__shfl_sync({FULL_MASK}, ldsm_addr, {base}) + ldsm_col));")
                lines.append(wrap(load, LINE_WIDTH, inner))
        lines.append(f"{indent}}}")
        return "\n".join(lines)

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        return restore_marked(self, state, anchor, "ldmatrix", "ldmatrix")

    @staticmethod
    def canonical_asm(indent: str, keyword: str, opcode: str, groups: list[list[str]], clobbers: tuple[str, ...],
                   anchor: Anchor | None = None) -> str:
        """The asm statement a marker describes, in the canonical layout (`render_asm`). Backward
        renders it too, to tell whether the marker must also record the statement verbatim."""
        match = _OPCODE.fullmatch(opcode)
        if match is None or len(groups) != 2 or len(groups[1]) != 1 or len(groups[0]) != int(match.group("num")):
            raise NotApplicable(f"the marker at {anchor} does not describe an ldmatrix this transform writes")
        registers, (address,) = groups
        count = len(registers)
        template = f"{opcode} {{{', '.join(f'%{i}' for i in range(count))}}}, [%{count}];"
        return render_asm(indent, keyword, template, [f'"=r"({r})' for r in registers], [f'"r"({address})'], clobbers)


register(ScalarizeLdmatrix())
