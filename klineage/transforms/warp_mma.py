"""warp_mma: a warpgroup MMA (`wgmma.mma_async`, sm_90a) whose operands are both K-major shared
tiles becomes, in each of the warpgroup's four warps, `mma.sync` m16n8k16 on `ldmatrix` fragments.

wgmma (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): the four warps of a
warpgroup together compute D (64 x N, fp32) = A (64 x 16) * B (16 x N) + (scale-d ? D : 0), A and B
read from shared memory through 64-bit matrix descriptors. Warp w (of the warpgroup: warp index % 4)
holds rows 16 w .. 16 w + 15 of D, and its accumulators 4 j .. 4 j + 3 are exactly the C fragment
of mma.m16n8k16 for the 8 columns 8 j .. 8 j + 7 of those rows. So each warp computes its own rows:
one ldmatrix.x4 gives its A fragment (16 rows x 16 k), one ldmatrix.x4 per pair of n8 tiles gives
their B fragments (8 rows of the N x 16 K-major B tile and 8 k each), and N / 8 mma.sync accumulate.

Where the operands are: a descriptor holds the start address (bits 0-13, in 16-byte units), the
stride byte offset between 8-row groups (bits 32-45), a base offset (bits 49-51) and the swizzle
mode (bits 62-63). In a K-major tile with the 128-byte swizzle the 8 rows of a group are 128 bytes
apart, and the hardware XORs address bits 4-6 with bits 7-9. The block reads the descriptors at
run time and traps on any other swizzle mode or a non-zero base offset (unknown fails); statically,
the instruction must take both operands from descriptors (not A from registers), with no transpose
and no negation (imm-scale 1, imm-trans 0), scale-d from a predicate `setp.ne.b32 p, X, 0` on one
operand, and the accumulators as `"+f"` outputs X[0] .. X[N/2 - 1] of one array.

mma.sync is synchronous, so the `wgmma.fence` / `commit_group` / `wait_group` statements around it
order nothing once no wgmma is left; but ptxas keeps a placeholder HGMMA for a commit group, so the
SASS would still say tensor-core work. The step that takes apart the last wgmma of the source
therefore takes those statements too, in whatever helpers hold them (`scope = "family"`: the
audit's locus is every function the step changed). Each asm statement is replaced by the marker
comment of the asm-helper transforms, always with the statement verbatim (the predicate and the
instruction are one template that no canonical layout describes), followed by the mma.sync block,
or for a fence, commit or wait by a block holding an empty statement (the CUDA grammar misreads a
bare `{}` after a comment there). Forward restores the anchor's statement, and every fence, commit
and wait of the state, byte for byte. Anchor: the helper's name.
"""

from __future__ import annotations

import re

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform
from klineage.transforms.scalarize_ldmatrix import (AsmStatement, Site, asm_anchors, asm_site, asm_sites, check_names,
                                                    indentation, lane_expression, marker_line, read_asm, render_asm,
                                                    restore_verbatim, verbatim_lines, warp_expression)

MNEMONIC = "wgmma.mma_async"
_SYNC = re.compile(r"^\s*wgmma\.(?:fence|commit_group|wait_group)\.sync\.aligned\b[^;]*;\s*$")
_IDLE = ";  // no warpgroup MMA is left: nothing to order or wait for"
_INSTRUCTION = re.compile(
    r"(?P<opcode>wgmma\.mma_async\.sync\.aligned\.m64n(?P<n>\d+)k16\.f32\.(?P<a>bf16|f16)\.(?P<b>bf16|f16))\s+"
    r"\{(?P<d>[^{}]*)\}\s*,\s*(?P<rest>[^;{}]*);")
_PREDICATE = re.compile(r"\.reg\s+\.pred\s+(?P<name>\w+)\s*;")
_SETP = re.compile(r"setp\.ne\.b32\s+(?P<name>\w+)\s*,\s*(?P<value>%\d+|-?\d+)\s*,\s*0\s*;")
_REF = re.compile(r"^%(\d+)$")
_ELEMENT = re.compile(r"^(?P<base>[A-Za-z_]\w*)\[(?P<index>\d+)\]$")
_LOCALS = {"wgmma_lane", "wgmma_row0", "wgmma_da", "wgmma_db", "wgmma_a0", "wgmma_b0", "wgmma_sa", "wgmma_sb",
           "wgmma_af", "wgmma_bf", "wgmma_j", "wgmma_i", "wgmma_r", "wgmma_at", "wgmma_swizzle"}


def _operand(asm: AsmStatement, ref: str, constraints: tuple[str, ...], what: str) -> str:
    found = _REF.fullmatch(ref.strip())
    if found is None or int(found.group(1)) >= len(asm.operands):
        raise NotApplicable(f"the wgmma's {what} {ref.strip()!r} is not a C operand reference")
    constraint, text = asm.operands[int(found.group(1))]
    if constraint not in constraints:
        raise NotApplicable(f"the wgmma's {what} has constraint {constraint!r}, not one of {constraints}")
    return text


class WgmmaShape:
    """What the block needs of one wgmma statement, read and checked from its asm."""

    def __init__(self, asm: AsmStatement):
        template = asm.template
        match = _INSTRUCTION.search(template)
        if match is None:
            if re.search(r"wgmma\.mma_async\S*\s+\{[^{}]*\}\s*,\s*\{", template):
                raise NotApplicable("the wgmma takes A from registers: only both operands from descriptors are "
                                    "emulated")
            raise NotApplicable("unsupported wgmma form: only .m64nNk16.f32 with bf16 or f16 operands")
        if match.group("a") != match.group("b"):
            raise NotApplicable(f"{match.group('opcode')} mixes A and B types")
        self.opcode, self.kind, self.n = match.group("opcode"), match.group("a"), int(match.group("n"))
        if self.n % 16 or not 16 <= self.n <= 256:
            raise NotApplicable(f"N = {self.n}: the block pairs n8 tiles, so N must be a multiple of 16 up to 256")
        rest = [r.strip() for r in match.group("rest").split(",")]
        if len(rest) != 7:
            raise NotApplicable("the wgmma needs a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, "
                                "imm-trans-b")
        desc_a, desc_b, scale, *immediates = rest
        if immediates != ["1", "1", "0", "0"]:
            raise NotApplicable(f"imm-scale-a/b, imm-trans-a/b are {', '.join(immediates)}: only 1, 1, 0, 0 "
                                f"(no negation, no transpose) is emulated")
        self.desc_a = _operand(asm, desc_a, ("l",), "A descriptor")
        self.desc_b = _operand(asm, desc_b, ("l",), "B descriptor")
        self.scale = self._scale(asm, template, scale)
        self.accumulator = self._accumulator(asm, match.group("d"))
        leftover = template.replace(match.group(0), "")
        leftover = _SETP.sub("", _PREDICATE.sub("", leftover)).replace("{", "").replace("}", "")
        if leftover.strip():
            raise NotApplicable(f"the asm does more than the wgmma and its scale-d predicate: {leftover.strip()!r}")

    @staticmethod
    def _scale(asm: AsmStatement, template: str, token: str) -> str:
        """The C expression whose non-zero value makes the wgmma accumulate."""
        declared = [m.group("name") for m in _PREDICATE.finditer(template)]
        setps = [m for m in _SETP.finditer(template) if m.group("name") == token]
        if token not in declared or len(setps) != 1:
            raise NotApplicable(f"scale-d {token!r} is not a predicate set once by setp.ne.b32 in the asm")
        value = setps[0].group("value")
        return value if not value.startswith("%") else _operand(asm, value, ("n", "r"), "scale-d operand")

    def _accumulator(self, asm: AsmStatement, listed: str) -> str:
        refs = [r.strip() for r in listed.split(",")]
        if refs != [f"%{i}" for i in range(self.n // 2)] or len(asm.outputs) != self.n // 2:
            raise NotApplicable(f"the accumulators must be the asm outputs %0 .. %{self.n // 2 - 1}")
        bases = set()
        for i, (constraint, text) in enumerate(asm.outputs):
            element = _ELEMENT.fullmatch(text.strip())
            if constraint != "+f" or element is None or int(element.group("index")) != i:
                raise NotApplicable(f"accumulator output {i} is {constraint!r}({text}), not \"+f\"(X[{i}])")
            bases.add(element.group("base"))
        if len(bases) != 1:
            raise NotApplicable(f"the accumulators are elements of several arrays: {sorted(bases)}")
        return bases.pop()


class WarpMma(Transform):
    name = "warp_mma"
    intent = ("Issue a warpgroup's 64xNx16 product as one asynchronous wgmma that reads both operands from "
              "swizzled shared memory through descriptors, instead of per-warp mma.sync on ldmatrix fragments.")
    removes = ("wgmma", "hgmma")
    adds = ("mma_sync", "ldmatrix", "hmma", "ldsm")
    after = ()
    scope = "family"  # the last wgmma goes with the fences, commits and waits of every helper

    def find(self, state: KernelState) -> list[Anchor]:
        return asm_anchors(cp.parse(state.source), MNEMONIC)

    # -- backward ----------------------------------------------------------------------------------

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site = asm_site(parsed, MNEMONIC, anchor)
        if site.asm is None:
            raise NotApplicable(f"the wgmma at {anchor} is already mma.sync")
        asm = read_asm(parsed, site.asm)
        shape = WgmmaShape(asm)
        check_names(parsed, asm.operand_nodes, _LOCALS, "warp_mma")
        indent = indentation(parsed, asm.statement)
        operands = (f"{{{shape.accumulator}[0 .. {shape.n // 2 - 1}]}}, {shape.desc_a}, {shape.desc_b}, "
                    f"{shape.scale}")
        # No canonical layout: the predicate and the instruction are one template, recorded verbatim.
        verbatim = verbatim_lines(parsed, asm, indent, canonical="")
        text = marker_line(asm, shape.opcode, operands, indent, verbatim) + "\n" + self._block(state, indent, shape)
        edits = [(asm.statement.start_byte, asm.statement.end_byte, text)]
        others = [s for found in asm_sites(parsed, MNEMONIC).values() for s in found
                  if s.asm is not None and s.start != site.start]
        syncs = [] if others else [s.asm for s in _sync_sites(parsed) if s.asm is not None]  # the last wgmma
        edits += [_idle(parsed, node) for node in syncs]
        source = _apply(parsed, sorted(edits))
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{shape.opcode} -> per warp 1 + {shape.n // 16} ldmatrix.x4 and {shape.n // 8} "
                                 f"mma.sync m16n8k16" + (f"; the last wgmma: {len(syncs)} fence/commit/wait "
                                                         f"statement(s) removed" if syncs else ""))

    @staticmethod
    def _block(state: KernelState, indent: str, shape: WgmmaShape) -> str:
        i1, i2 = indent + "    ", indent + "        "
        d, kind = shape.accumulator, shape.kind
        mma = (f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};")
        ldsm = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"

        def mma_statement(tile: str, b0: str, b1: str) -> str:
            outputs = [f'"+f"({d}[4 * {tile} + {i}])' for i in range(4)]
            inputs = [f'"r"(wgmma_af[{i}])' for i in range(4)] + [f'"r"({b0})', f'"r"({b1})']
            return i2 + render_asm(i2, "asm volatile", mma, outputs, inputs)

        def ldsm_statement(target: str, address: str) -> str:
            return i2 + render_asm(i2, "asm volatile", ldsm, [f'"=r"({target}[{i}])' for i in range(4)],
                                   [f'"r"(wgmma_swizzle({address}))'])

        return "\n".join([
            f"{indent}{{",
            f"{i1}// This warp's 16 rows of the warpgroup's 64 x {shape.n} tile with mma.sync: its accumulators",
            f"{i1}// 4 j .. 4 j + 3 are the C fragment of the n8 tile j. Both operands are K-major tiles with the",
            f"{i1}// 128-byte swizzle, read through their descriptors (start address, bits 0-13, in 16-byte units;",
            f"{i1}// 8-row groups the stride byte offset apart, bits 32-45; rows of a group 128 bytes apart).",
            f"{i1}const unsigned long long wgmma_da = {shape.desc_a};",
            f"{i1}const unsigned long long wgmma_db = {shape.desc_b};",
            f"{i1}if ((wgmma_da >> 62) != 1 || (wgmma_db >> 62) != 1 || ((wgmma_da >> 49) & 7) != 0 || "
            f"((wgmma_db >> 49) & 7) != 0)",
            f"{i2}__trap();  // another swizzle mode, or a base offset: not emulated",
            f"{i1}auto wgmma_swizzle = [](unsigned wgmma_at) {{ return wgmma_at ^ (((wgmma_at >> 7) & 7) << 4); }};",
            f"{i1}const unsigned wgmma_a0 = static_cast<unsigned>(wgmma_da & 0x3FFF) << 4;",
            f"{i1}const unsigned wgmma_b0 = static_cast<unsigned>(wgmma_db & 0x3FFF) << 4;",
            f"{i1}const unsigned wgmma_sa = static_cast<unsigned>((wgmma_da >> 32) & 0x3FFF) << 4;",
            f"{i1}const unsigned wgmma_sb = static_cast<unsigned>((wgmma_db >> 32) & 0x3FFF) << 4;",
            f"{i1}const unsigned wgmma_lane = {lane_expression(state)};",
            f"{i1}const unsigned wgmma_row0 = 16 * (({warp_expression(state)}) & 3);  // warp w of the warpgroup: rows 16 w ..",
            f"{i1}if (({shape.scale}) == 0) {{  // scale-d = 0: D = A B",
            "#pragma unroll",
            f"{i2}for (int wgmma_i = 0; wgmma_i < {shape.n // 2}; ++wgmma_i) {d}[wgmma_i] = 0.0f;",
            f"{i1}}}",
            f"{i1}unsigned wgmma_af[4];  // A rows 16 w + (l % 16), k = 8 (l / 16) .. + 7: matrices a0 .. a3",
            f"{i1}{{",
            f"{i2}const unsigned wgmma_r = wgmma_row0 + (wgmma_lane & 15);",
            ldsm_statement("wgmma_af", "wgmma_a0 + (wgmma_r >> 3) * wgmma_sa + (wgmma_r & 7) * 128 + "
                                       "(wgmma_lane >> 4) * 16"),
            f"{i1}}}",
            "#pragma unroll",
            f"{i1}for (int wgmma_j = 0; wgmma_j < {shape.n // 8}; wgmma_j += 2) {{  // n8 tiles j and j + 1",
            f"{i2}const unsigned wgmma_r = 8 * wgmma_j + (wgmma_lane & 7) + ((wgmma_lane >> 4) << 3);",
            f"{i2}unsigned wgmma_bf[4];  // b0, b1 of tile j, then of tile j + 1",
            ldsm_statement("wgmma_bf", "wgmma_b0 + (wgmma_r >> 3) * wgmma_sb + (wgmma_r & 7) * 128 + "
                                       "((wgmma_lane >> 3) & 1) * 16"),
            mma_statement("wgmma_j", "wgmma_bf[0]", "wgmma_bf[1]"),
            mma_statement("(wgmma_j + 1)", "wgmma_bf[2]", "wgmma_bf[3]"),
            f"{i1}}}",
            f"{indent}}}",
        ])

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site = asm_site(parsed, MNEMONIC, anchor)
        if site.marked is None:
            raise NotApplicable(f"{anchor} already uses wgmma")
        marked = [site.marked, *(s.marked for s in _sync_sites(parsed) if s.marked is not None)]
        edits = []
        for block in marked:
            if not block.verbatim:
                raise NotApplicable(f"the marker of {block.opcode} records no statement to restore")
            edits.append((block.comment.start_byte, block.block.end_byte,
                          restore_verbatim(block.verbatim, indentation(parsed, block.comment))))
        return self.rewrite(state, anchor, Direction.FORWARD, _apply(parsed, sorted(edits)),
                            note=f"restored {site.marked.opcode}" + (f" and {len(marked) - 1} fence/commit/wait "
                                                                      f"statement(s)" if len(marked) > 1 else ""))


def _sync_sites(parsed: cp.ParsedSource) -> list[Site]:
    """Every wgmma fence, commit and wait inside a function, as asm or as the marker that replaced it."""
    return [site for found in asm_sites(parsed, "wgmma").values() for site in found
            if _SYNC.match(site.code if site.asm is not None else site.marked.opcode + ";")]


def _idle(parsed: cp.ParsedSource, node) -> tuple[int, int, str]:
    """The edit that replaces a fence, commit or wait statement by its marker and an idle block."""
    asm = read_asm(parsed, node)
    indent = indentation(parsed, asm.statement)
    opcode = asm.template.strip().rstrip(";").split()[0]
    operands = ", ".join(text for _, text in asm.operands)
    text = (marker_line(asm, opcode, operands, indent, verbatim_lines(parsed, asm, indent, canonical=""))
            + f"\n{indent}{{\n{indent}    {_IDLE}\n{indent}}}")
    return asm.statement.start_byte, asm.statement.end_byte, text


def _apply(parsed: cp.ParsedSource, edits: list[tuple[int, int, str]]) -> str:
    """The source with each byte range [start, end) replaced by its text (ranges apart, in order)."""
    data = parsed.data
    for start, end, text in reversed(edits):
        data = data[:start] + text.encode("utf-8") + data[end:]
    return data.decode("utf-8")


register(WarpMma())
