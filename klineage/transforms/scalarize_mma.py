"""scalarize_mma: an `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` helper becomes
scalar fp32 FMAs with the same fragment semantics.

mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"): the warp
computes D (16 x 8, fp32) = A (16 x 16, row) * B (16 x 8, col) + C. With groupID g = l / 4 and
threadID_in_group t = l % 4 of lane l:

- A: register r of lane l holds two 16-bit elements (the lower k in the low half) of row g + 8 (r % 2),
  columns k = 8 (r / 2) + 2 t and k + 1;
- B: register r holds rows k = 8 r + 2 t and k + 1 of column g;
- C, D: element i is row g + 8 (i / 2), column 2 t + (i % 2).

So lane l needs A rows g and g + 8, which its own quad (lanes 4 g .. 4 g + 3) holds, and B columns
2 t and 2 t + 1, which lanes 8 t + t' and 8 t + 4 + t' hold (t' = 0..3). The scalar form fetches them
with `__shfl_sync` (32 shuffles per MMA), converts with `__bfloat162float` / `__half2float`, and
accumulates each of its four outputs in fp32 with `fmaf`, k = 0 .. 15 in order, starting from C.
Products of two bf16 or two f16 values are exact in fp32, so the result differs from the tensor
core's only in the order (and internal precision) of the 16 additions.

The asm statement is replaced in place by a marker comment and the scalar block (see
scalarize_ldmatrix); forward rebuilds the canonical asm from the marker, or restores the statement
the marker recorded verbatim where the expert laid it out otherwise. Anchor: the helper's name.
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

_OPCODE = re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(?P<a>bf16|f16)\.(?P<b>bf16|f16)\.f32")
_LOCALS = {"mma_lane", "mma_row_src", "mma_col_src", "mma_h", "mma_t", "mma_e", "mma_a_top", "mma_a_bottom",
           "mma_b_half", "mma_top", "mma_bottom", "mma_left", "mma_right", "mma_shift", "mma_at", "mma_ab", "mma_bl",
           "mma_br"} | {f"mma_{x}{i}" for x in "abd" for i in range(4)}
# Type -> (conversion of a 16-bit pattern to float, headers that declare it).
_CONVERT = {
    "bf16": ("__bfloat162float(__ushort_as_bfloat16({}))", ("cuda_bf16.h", "mma.h")),
    "f16": ("__half2float(__ushort_as_half({}))", ("cuda_fp16.h", "cuda_bf16.h", "mma.h")),
}


def _includes(parsed: cp.ParsedSource) -> set[str]:
    found = set()
    for node in cp.nodes_of_type(parsed.root, "preproc_include"):
        path = node.child_by_field_name("path")
        if path is not None:
            found.add(parsed.text(path).strip("<>\"").rsplit("/", 1)[-1])
    return found


class ScalarizeMma(Transform):
    name = "scalarize_mma"
    intent = ("Compute a warp's 16x8x16 fragment product on tensor cores with mma.sync instead of per-lane "
              "scalar fp32 FMAs over operand elements gathered from the other lanes with shuffles.")
    removes = ("mma_sync", "hmma")
    adds = ("shfl", "ffma")
    after = ()

    def find(self, state: KernelState) -> list[Anchor]:
        return asm_anchors(cp.parse(state.source), "mma")

    # -- backward ----------------------------------------------------------------------------------

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site = asm_site(parsed, "mma", anchor)
        if site.asm is None:
            raise NotApplicable(f"the mma at {anchor} is already scalar")
        asm = read_asm(parsed, site.asm)
        opcode = asm.instruction.split(" ", 1)[0]
        if not opcode.startswith("mma.sync.aligned.m16n8k16."):
            raise NotApplicable(f"{opcode} is not supported: only mma.sync m16n8k16 (no wgmma expert exists yet)")
        match, groups = operand_groups(asm, _OPCODE)
        if match.group("a") != match.group("b"):
            raise NotApplicable(f"{opcode} mixes A and B types")
        kind = match.group("a")
        if [len(g) for g in groups] != [4, 4, 2, 4]:
            raise NotApplicable(f"{opcode} needs operands {{d0..d3}}, {{a0..a3}}, {{b0, b1}}, {{c0..c3}}")
        d_ops, a_ops, b_ops, c_ops = groups
        n_out = len(asm.outputs)
        if sorted(d_ops) != d_ops or d_ops != list(range(4)) or n_out != 4:
            raise NotApplicable("the mma outputs are not the asm outputs %0..%3")
        tied = all(c.startswith("+") for c, _ in asm.outputs)
        for constraint, text in asm.outputs:
            if constraint not in ("=f", "+f", "=&f"):
                raise NotApplicable(f"mma output {text} has constraint {constraint!r}, not \"=f\" or \"+f\"")
        for number in a_ops + b_ops:
            if number < n_out or asm.operands[number][0] != "r":
                raise NotApplicable(f"mma operand %{number} is not a 32-bit register input (\"r\")")
        if tied:
            if c_ops != d_ops:
                raise NotApplicable("with \"+f\" outputs the mma accumulator must be the outputs themselves")
        elif any(n < n_out or asm.operands[n][0] != "f" for n in c_ops):
            raise NotApplicable("the mma accumulator C is neither the \"+f\" outputs nor \"f\" inputs")
        convert, headers = _CONVERT[kind]
        if not _includes(parsed) & set(headers):
            raise NotApplicable(f"the scalar form converts {kind} with {convert.split('(')[0]}, which needs "
                                f"<{headers[0]}>; the source does not include it")
        check_names(parsed, asm.operand_nodes, _LOCALS, "scalarize_mma")

        text_of = [t for _, t in asm.operands]
        d, a, b, c = ([text_of[n] for n in g] for g in groups)
        indent = indentation(parsed.data, asm.statement.start_byte)
        operands = f"{{{', '.join(d)}}}, {{{', '.join(a)}}}, {{{', '.join(b)}}}, {{{', '.join(c)}}}"
        # What forward will render from this marker; a statement laid out otherwise (the conv2d and
        # gdn experts split their template strings elsewhere) is recorded verbatim for forward to restore.
        canonical = self.canonical_asm(indent, asm.keyword, opcode, marker_groups(operands), asm.clobbers)
        verbatim = verbatim_lines(parsed, asm, indent, canonical)
        text = (marker_line(asm, opcode, operands, indent, verbatim) + "\n"
                + self._scalar_block(state, indent, kind, d, a, b, c))
        source = splice(parsed.data, [(asm.statement.start_byte, asm.statement.end_byte, text)])[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{opcode} -> 32 shuffles and 64 fp32 FMAs per lane ({kind} converted to float)")

    @staticmethod
    def _scalar_block(state: KernelState, indent: str, kind: str, d: list[str], a: list[str], b: list[str],
                      c: list[str]) -> str:
        convert = _CONVERT[kind][0]
        i1, i2, i3, i4 = (indent + "    " * n for n in range(1, 5))

        def element(name: str, word: str) -> str:
            value = convert.format(f"static_cast<unsigned short>({word} >> mma_shift)")
            return wrap(f"const float {name} = {value};", LINE_WIDTH, i4)

        lines = [
            f"{indent}{{",
            f"{i1}// D = A B + C on a 16 x 8 x 16 tile in fp32, k = 0 .. 15 in order. Lane l holds D rows l / 4",
            f"{i1}// and l / 4 + 8, columns 2 (l % 4) and 2 (l % 4) + 1. A row r, k = 8 h + 2 t + {{0, 1}} is in",
            f"{i1}// register 2 h + r / 8 of lane 4 (r % 8) + t; B column n, the same k, in register h of lane",
            f"{i1}// 4 n + t (the lower k in the low 16 bits).",
            f"{i1}const int mma_lane = {lane_expression(state)};",
            f"{i1}const int mma_row_src = mma_lane & ~3;       // lane 4 (l / 4): A rows l / 4 and l / 4 + 8",
            f"{i1}const int mma_col_src = 8 * (mma_lane & 3);  // lane 4 * 2 (l % 4): B column 2 (l % 4)",
            *[f"{i1}const unsigned mma_a{i} = {x};" for i, x in enumerate(a)],
            *[f"{i1}const unsigned mma_b{i} = {x};" for i, x in enumerate(b)],
            *[f"{i1}float mma_d{i} = {x};" for i, x in enumerate(c)],
            f"{i1}for (int mma_h = 0; mma_h < 2; ++mma_h) {{  // k = 0 .. 7, then 8 .. 15",
            f"{i2}const unsigned mma_a_top = mma_h == 0 ? mma_a0 : mma_a2;  // A row l / 4",
            f"{i2}const unsigned mma_a_bottom = mma_h == 0 ? mma_a1 : mma_a3;  // A row l / 4 + 8",
            f"{i2}const unsigned mma_b_half = mma_h == 0 ? mma_b0 : mma_b1;",
            f"{i2}for (int mma_t = 0; mma_t < 4; ++mma_t) {{  // k = 8 h + 2 t and 8 h + 2 t + 1",
            f"{i3}const unsigned mma_top = __shfl_sync({FULL_MASK}, mma_a_top, mma_row_src + mma_t);",
            f"{i3}const unsigned mma_bottom = __shfl_sync({FULL_MASK}, mma_a_bottom, mma_row_src + mma_t);",
            f"{i3}const unsigned mma_left = __shfl_sync({FULL_MASK}, mma_b_half, mma_col_src + mma_t);",
            f"{i3}const unsigned mma_right = __shfl_sync({FULL_MASK}, mma_b_half, mma_col_src + 4 + mma_t);",
            f"{i3}for (int mma_e = 0; mma_e < 2; ++mma_e) {{  // k = 8 h + 2 t + e",
            f"{i4}const int mma_shift = 16 * mma_e;",
            element("mma_at", "mma_top"),
            element("mma_ab", "mma_bottom"),
            element("mma_bl", "mma_left"),
            element("mma_br", "mma_right"),
            f"{i4}mma_d0 = fmaf(mma_at, mma_bl, mma_d0);",
            f"{i4}mma_d1 = fmaf(mma_at, mma_br, mma_d1);",
            f"{i4}mma_d2 = fmaf(mma_ab, mma_bl, mma_d2);",
            f"{i4}mma_d3 = fmaf(mma_ab, mma_br, mma_d3);",
            f"{i3}}}",
            f"{i2}}}",
            f"{i1}}}",
        ]
        lines += [f"{i1}{target} = mma_d{i};" for i, target in enumerate(d)]
        lines.append(f"{indent}}}")
        return "\n".join(lines)

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        return restore_marked(self, state, anchor, "mma", "mma.sync")

    @staticmethod
    def canonical_asm(indent: str, keyword: str, opcode: str, groups: list[list[str]], clobbers: tuple[str, ...],
                   anchor: Anchor | None = None) -> str:
        """The asm statement a marker describes, in the canonical layout (`render_asm`). Backward
        renders it too, to tell whether the marker must also record the statement verbatim."""
        if _OPCODE.fullmatch(opcode) is None or [len(g) for g in groups] != [4, 4, 2, 4]:
            raise NotApplicable(f"the marker at {anchor} does not describe an mma this transform writes")
        d, a, b, c = groups
        refs = [f"%{i}" for i in range(14)]
        inputs = [f'"r"({x})' for x in a + b]
        if c == d:  # the accumulator is the outputs: "+f", C names them again
            outputs = [f'"+f"({x})' for x in d]
            operand_refs = [refs[0:4], refs[4:8], refs[8:10], refs[0:4]]
        else:
            outputs = [f'"=f"({x})' for x in d]
            inputs += [f'"f"({x})' for x in c]
            operand_refs = [refs[0:4], refs[4:8], refs[8:10], refs[10:14]]
        template = f"{opcode} " + ", ".join("{" + ", ".join(g) + "}" for g in operand_refs) + ";"
        return render_asm(indent, keyword, template, outputs, inputs, clobbers)


register(ScalarizeMma())
