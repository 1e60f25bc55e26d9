"""warp_mma: a warpgroup MMA (`wgmma.mma_async`, sm_90a) becomes, in each of the warpgroup's four
warps, `mma.sync` m16n8k16, with its operands from `ldmatrix` fragments or from registers.

wgmma (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): the four warps of a
warpgroup together compute D (64 x N, fp32) = A (64 x 16) * B (16 x N) + (scale-d ? D : 0), B read
from shared memory through a 64-bit matrix descriptor, A likewise or from registers. Warp w (of the
warpgroup: warp index % 4) holds rows 16 w .. 16 w + 15 of D, and its accumulators 4 j .. 4 j + 3
are exactly the C fragment of mma.m16n8k16 for the 8 columns 8 j .. 8 j + 7 of those rows. So each
warp computes its own rows with N / 8 mma.sync. Two forms are emulated:

- Both operands from descriptors, both K-major (imm-trans-a = imm-trans-b = 0): one ldmatrix.x4
  gives the warp's A fragment (16 rows x 16 k), one ldmatrix.x4 per pair of n8 tiles their B
  fragments (8 rows of the N x 16 B tile and 8 k each).
- A from four 32-bit registers (wgmma's register-A form), B MN-major (imm-trans-b = 1, the form of
  a `P V` product whose V is stored key-major): the registers are the warp's A fragment as they
  are, and one ldmatrix.x4.trans per pair of n8 tiles gives their B fragments, k rows 0-7 and 8-15.
  Relied on: the PTX ISA's register-A fragment of wgmma .m64nNk16 with .f16/.bf16 ("Matrix
  Fragments for wgmma.mma_async.m64nNk16", 9.7.15.5.1.1.1 in PTX ISA 8.x; its layout is given as
  a figure only) puts a_i of lane l of warp w at row 16 w + l / 4 + 8 ((i / 2) % 2), k = 2 (l % 4)
  + i % 2 + 8 (i / 4), which is "Matrix Fragments for mma.m16n8k16 with floating point type"
  (9.7.14.5.8) shifted by 16 w rows; CUTLASS's ALayout_64x16 of SM90 GMMA says the same.

The descriptors are read at run time (fields and canonical 128-byte-swizzle layouts:
`wgmma_fragments`, from the PTX ISA's "Matrix Descriptor Format" and "Shared Memory Matrix
Layout"); the block traps on any swizzle mode but 128 bytes or a non-zero base offset (unknown
fails). Statically the instruction must be .m64nNk16.f32 with one type (f16 or bf16) for A and B,
N a multiple of 16; no negation (imm-scale 1); no transpose with both operands from descriptors;
B MN-major with A from registers; scale-d from a predicate `setp.ne.b32 p, X, 0` on one operand;
the accumulators `"+f"` outputs X[0] .. X[N/2 - 1] of one array; descriptors `"l"`, A registers
`"r"`. Anything else is NotApplicable with the reason.

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
from klineage.transforms._asm import (
    AsmStatement,
    Site,
    asm_anchors,
    asm_site,
    asm_sites,
    check_names,
    lane_expression,
    marker_line,
    read_asm,
    restore_verbatim,
    split_operands,
    verbatim_lines,
    warp_expression,
)
from klineage.transforms._edit import indentation
from klineage.transforms._wgmma_fragments import LOCALS, k_major_block, register_a_block
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

MNEMONIC = "wgmma.mma_async"
_SYNC = re.compile(r"^\s*wgmma\.(?:fence|commit_group|wait_group)\.sync\.aligned\b[^;]*;\s*$")
_IDLE = ";  // no warpgroup MMA is left: nothing to order or wait for"
_HEAD = (r"(?P<opcode>wgmma\.mma_async\.sync\.aligned\.m64n(?P<n>\d+)k16\.f32\.(?P<a>bf16|f16)\.(?P<b>bf16|f16))\s+"
         r"\{(?P<d>[^{}]*)\}\s*,\s*")
_INSTRUCTION = re.compile(_HEAD + r"(?P<rest>[^;{}]*);")
_REGISTER_A = re.compile(_HEAD + r"\{(?P<registers>[^{}]*)\}\s*,\s*(?P<rest>[^;{}]*);")  # A from registers
_PREDICATE = re.compile(r"\.reg\s+\.pred\s+(?P<name>\w+)\s*;")
_SETP = re.compile(r"setp\.ne\.b32\s+(?P<name>\w+)\s*,\s*(?P<value>%\d+|-?\d+)\s*,\s*0\s*;")
_REF = re.compile(r"^%(\d+)$")
_ELEMENT = re.compile(r"^(?P<base>[A-Za-z_]\w*)\[(?P<index>\d+)\]$")


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
        match = _INSTRUCTION.search(template) or _REGISTER_A.search(template)
        if match is None:
            raise NotApplicable("unsupported wgmma form: only .m64nNk16.f32 with bf16 or f16 operands")
        if match.group("a") != match.group("b"):
            raise NotApplicable(f"{match.group('opcode')} mixes A and B types")
        self.opcode, self.kind, self.n = match.group("opcode"), match.group("a"), int(match.group("n"))
        if self.n % 16 or not 16 <= self.n <= 256:
            raise NotApplicable(f"N = {self.n}: the block pairs n8 tiles, so N must be a multiple of 16 up to 256")
        rest = [r.strip() for r in match.group("rest").split(",")]
        self.registers_a = match.re is _REGISTER_A
        if self.registers_a:
            scale = self._register_form(asm, match.group("registers"), rest)
        else:
            scale = self._descriptor_form(asm, rest)
        self.scale = self._scale(asm, template, scale)
        self.accumulator = self._accumulator(asm, match.group("d"))
        leftover = template.replace(match.group(0), "")
        leftover = _SETP.sub("", _PREDICATE.sub("", leftover)).replace("{", "").replace("}", "")
        if leftover.strip():
            raise NotApplicable(f"the asm does more than the wgmma and its scale-d predicate: {leftover.strip()!r}")

    def _descriptor_form(self, asm: AsmStatement, rest: list[str]) -> str:
        """A and B both K-major from descriptors; returns the scale-d token."""
        if len(rest) != 7:
            raise NotApplicable("the wgmma needs a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, "
                                "imm-trans-b")
        desc_a, desc_b, scale, *immediates = rest
        if immediates != ["1", "1", "0", "0"]:
            raise NotApplicable(f"imm-scale-a/b, imm-trans-a/b are {', '.join(immediates)}: only 1, 1, 0, 0 "
                                f"(no negation, no transpose) is emulated")
        self.desc_a = _operand(asm, desc_a, ("l",), "A descriptor")
        self.desc_b = _operand(asm, desc_b, ("l",), "B descriptor")
        return scale

    def _register_form(self, asm: AsmStatement, registers: str, rest: list[str]) -> str:
        """A from four 32-bit registers, B MN-major from its descriptor; returns the scale-d token."""
        if len(rest) != 5:
            raise NotApplicable("the register-A wgmma needs b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-b")
        desc_b, scale, *immediates = rest
        if immediates != ["1", "1", "1"]:
            raise NotApplicable(f"imm-scale-a/b, imm-trans-b are {', '.join(immediates)}: with A from registers "
                                f"only 1, 1, 1 (no negation, B MN-major) is emulated")
        refs = split_operands(registers)
        if len(refs) != 4:
            raise NotApplicable(f"the wgmma's A is {len(refs)} registers, not the four of .m64nNk16 with "
                                f"{self.kind}")
        self.a_registers = [_operand(asm, ref, ("r",), f"A register {i}") for i, ref in enumerate(refs)]
        self.desc_a, self.desc_b = None, _operand(asm, desc_b, ("l",), "B descriptor")
        return scale

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
    intent = ("Issue a warpgroup's 64xNx16 product as one asynchronous wgmma that reads its shared operands from "
              "swizzled shared memory through descriptors (A possibly from registers), instead of per-warp "
              "mma.sync on ldmatrix fragments.")
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
        check_names(parsed, asm.operand_nodes, LOCALS, "warp_mma")
        indent = indentation(parsed.data, asm.statement.start_byte)
        a = f"{{{', '.join(shape.a_registers)}}}" if shape.registers_a else shape.desc_a
        operands = f"{{{shape.accumulator}[0 .. {shape.n // 2 - 1}]}}, {a}, {shape.desc_b}, {shape.scale}"
        # No canonical layout: the predicate and the instruction are one template, recorded verbatim.
        verbatim = verbatim_lines(parsed, asm, indent, canonical="")
        text = marker_line(asm, shape.opcode, operands, indent, verbatim) + "\n" + _block(state, indent, shape)
        edits = [(asm.statement.start_byte, asm.statement.end_byte, text)]
        others = [s for found in asm_sites(parsed, MNEMONIC).values() for s in found
                  if s.asm is not None and s.start != site.start]
        syncs = [] if others else [s.asm for s in _sync_sites(parsed) if s.asm is not None]  # the last wgmma
        edits += [_idle(parsed, node) for node in syncs]
        source = _apply(parsed, sorted(edits))
        loads = (f"{shape.n // 16} ldmatrix.x4.trans (A from its registers)" if shape.registers_a
                 else f"1 + {shape.n // 16} ldmatrix.x4")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{shape.opcode} -> per warp {loads} and {shape.n // 8} mma.sync m16n8k16"
                                 + (f"; the last wgmma: {len(syncs)} fence/commit/wait statement(s) removed"
                                    if syncs else ""))

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
                          restore_verbatim(block.verbatim, indentation(parsed.data, block.comment.start_byte))))
        return self.rewrite(state, anchor, Direction.FORWARD, _apply(parsed, sorted(edits)),
                            note=f"restored {site.marked.opcode}" + (f" and {len(marked) - 1} fence/commit/wait "
                                                                      f"statement(s)" if len(marked) > 1 else ""))


def _block(state: KernelState, indent: str, shape: WgmmaShape) -> str:
    if shape.registers_a:
        return register_a_block(indent, shape.kind, shape.n, shape.accumulator, shape.a_registers, shape.desc_b,
                                shape.scale, lane_expression(state))
    return k_major_block(indent, shape.kind, shape.n, shape.accumulator, shape.desc_a, shape.desc_b, shape.scale,
                         lane_expression(state), warp_expression(state))


def _sync_sites(parsed: cp.ParsedSource) -> list[Site]:
    """Every wgmma fence, commit and wait inside a function, as asm or as the marker that replaced it."""
    return [site for found in asm_sites(parsed, "wgmma").values() for site in found
            if _SYNC.match(site.code if site.asm is not None else site.marked.opcode + ";")]


def _idle(parsed: cp.ParsedSource, node) -> tuple[int, int, str]:
    """The edit that replaces a fence, commit or wait statement by its marker and an idle block."""
    asm = read_asm(parsed, node)
    indent = indentation(parsed.data, asm.statement.start_byte)
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
