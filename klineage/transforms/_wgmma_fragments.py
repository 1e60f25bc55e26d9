"""The per-warp mma.sync blocks that `warp_mma` writes in place of a wgmma: descriptor fields, the
shared-memory addresses of the canonical 128-byte-swizzled layouts, and the ldmatrix / mma.sync
statements that give one warp its 16 rows of the warpgroup's 64 x N product.

Descriptor (PTX ISA, "Matrix Descriptor Format" of the asynchronous warpgroup MMA): start address
in bits 0-13, leading byte offset (LBO) in bits 16-29, stride byte offset (SBO) in bits 32-45, all
in 16-byte units; base offset in bits 49-51; swizzle mode in bits 62-63 (1 = 128 bytes).

Canonical layouts for 16-bit elements with the 128-byte swizzle (PTX ISA, "Shared Memory Matrix
Layout", its canonical-layout table, T = 8 elements = 16 bytes), as byte offsets from the start
address before the swizzle XORs address bits 4-6 with bits 7-9:

- K-major, rows of M (or N): row r, element k at (r / 8) SBO + (r % 8) 128 + 2 k; LBO unused.
- MN-major (B with imm-trans-b = 1): k row k, column n at (k / 8) SBO + (k % 8) 128 +
  (n / 64) LBO + 2 (n % 64): 64 columns per 128-byte line, 8 lines a swizzle atom, the 8-row
  groups of K SBO apart and the next 64 columns of N LBO further.

Only the 128-byte swizzle with base offset 0 is handled; the block checks both at run time and
traps on anything else.
"""

from __future__ import annotations

from klineage.transforms._asm import render_asm

SWIZZLE = "auto wgmma_swizzle = [](unsigned wgmma_at) { return wgmma_at ^ (((wgmma_at >> 7) & 7) << 4); };"
TRAP = "__trap();  // another swizzle mode, or a base offset: not emulated"
LOCALS = {"wgmma_lane", "wgmma_row0", "wgmma_da", "wgmma_db", "wgmma_a0", "wgmma_b0", "wgmma_sa", "wgmma_sb",
          "wgmma_lb", "wgmma_af", "wgmma_bf", "wgmma_j", "wgmma_i", "wgmma_r", "wgmma_k", "wgmma_n", "wgmma_at",
          "wgmma_swizzle"}


def _field(descriptor: str, shift: int) -> str:
    """A 14-bit descriptor field in bytes."""
    value = f"{descriptor} & 0x3FFF" if not shift else f"({descriptor} >> {shift}) & 0x3FFF"
    return f"static_cast<unsigned>({value}) << 4"


class Statements:
    """The mma.sync and ldmatrix statements of one block, at indentation `indent`."""

    def __init__(self, indent: str, kind: str, accumulator: str):
        self.indent, self.accumulator = indent, accumulator
        self.mma = (f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
                    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};")

    def mma_statement(self, tile: str, b0: str, b1: str) -> str:
        outputs = [f'"+f"({self.accumulator}[4 * {tile} + {i}])' for i in range(4)]
        inputs = [f'"r"(wgmma_af[{i}])' for i in range(4)] + [f'"r"({b0})', f'"r"({b1})']
        return self.indent + render_asm(self.indent, "asm volatile", self.mma, outputs, inputs)

    def ldsm_statement(self, target: str, address: str, trans: bool = False) -> str:
        ldsm = f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 {{%0, %1, %2, %3}}, [%4];"
        return self.indent + render_asm(self.indent, "asm volatile", ldsm,
                                        [f'"=r"({target}[{i}])' for i in range(4)],
                                        [f'"r"(wgmma_swizzle({address}))'])

    def tile_pairs(self, n: int, row: str, address: str, trans: bool = False) -> list[str]:
        """The loop over pairs of n8 tiles: `row` declares what `address` (of the lane's B row) uses,
        one ldmatrix.x4 loads both tiles' B fragments, and two mma.sync accumulate them."""
        i1, i2 = self.indent[:-4], self.indent
        return ["#pragma unroll",
                f"{i1}for (int wgmma_j = 0; wgmma_j < {n // 8}; wgmma_j += 2) {{  // n8 tiles j and j + 1",
                f"{i2}{row}",
                f"{i2}unsigned wgmma_bf[4];  // b0, b1 of tile j, then of tile j + 1",
                self.ldsm_statement("wgmma_bf", address, trans),
                self.mma_statement("wgmma_j", "wgmma_bf[0]", "wgmma_bf[1]"),
                self.mma_statement("(wgmma_j + 1)", "wgmma_bf[2]", "wgmma_bf[3]"),
                f"{i1}}}"]

    def zero(self, scale: str, n: int) -> list[str]:
        """D = 0 first when scale-d is 0 (D = A B)."""
        i1, i2 = self.indent[:-4], self.indent
        return [f"{i1}if (({scale}) == 0) {{  // scale-d = 0: D = A B",
                "#pragma unroll",
                f"{i2}for (int wgmma_i = 0; wgmma_i < {n // 2}; ++wgmma_i) {self.accumulator}[wgmma_i] = 0.0f;",
                f"{i1}}}"]


def _opening(indent: str, n: int) -> list[str]:
    """The block's brace and the first line of its comment, the same in both forms."""
    return [f"{indent}{{",
            f"{indent}    // This warp's 16 rows of the warpgroup's 64 x {n} tile with mma.sync: its accumulators"]


def k_major_block(indent: str, kind: str, n: int, accumulator: str, desc_a: str, desc_b: str, scale: str,
                  lane: str, warp: str) -> str:
    """Both operands K-major from descriptors: one ldmatrix.x4 for the warp's A fragment, one per
    pair of n8 tiles for their B fragments (8 rows of the N x 16 B tile each)."""
    i1, i2 = indent + "    ", indent + "        "
    put = Statements(i2, kind, accumulator)
    return "\n".join([
        *_opening(indent, n),
        f"{i1}// 4 j .. 4 j + 3 are the C fragment of the n8 tile j. Both operands are K-major tiles with the",
        f"{i1}// 128-byte swizzle, read through their descriptors (start address, bits 0-13, in 16-byte units;",
        f"{i1}// 8-row groups the stride byte offset apart, bits 32-45; rows of a group 128 bytes apart).",
        f"{i1}const unsigned long long wgmma_da = {desc_a};",
        f"{i1}const unsigned long long wgmma_db = {desc_b};",
        f"{i1}if ((wgmma_da >> 62) != 1 || (wgmma_db >> 62) != 1 || ((wgmma_da >> 49) & 7) != 0 || "
        f"((wgmma_db >> 49) & 7) != 0)",
        f"{i2}{TRAP}",
        f"{i1}{SWIZZLE}",
        f"{i1}const unsigned wgmma_a0 = {_field('wgmma_da', 0)};",
        f"{i1}const unsigned wgmma_b0 = {_field('wgmma_db', 0)};",
        f"{i1}const unsigned wgmma_sa = {_field('wgmma_da', 32)};",
        f"{i1}const unsigned wgmma_sb = {_field('wgmma_db', 32)};",
        f"{i1}const unsigned wgmma_lane = {lane};",
        f"{i1}const unsigned wgmma_row0 = 16 * (({warp}) & 3);  // warp w of the warpgroup: rows 16 w ..",
        *put.zero(scale, n),
        f"{i1}unsigned wgmma_af[4];  // A rows 16 w + (l % 16), k = 8 (l / 16) .. + 7: matrices a0 .. a3",
        f"{i1}{{",
        f"{i2}const unsigned wgmma_r = wgmma_row0 + (wgmma_lane & 15);",
        put.ldsm_statement("wgmma_af", "wgmma_a0 + (wgmma_r >> 3) * wgmma_sa + (wgmma_r & 7) * 128 + "
                                       "(wgmma_lane >> 4) * 16"),
        f"{i1}}}",
        *put.tile_pairs(n, "const unsigned wgmma_r = 8 * wgmma_j + (wgmma_lane & 7) + ((wgmma_lane >> 4) << 3);",
                        "wgmma_b0 + (wgmma_r >> 3) * wgmma_sb + (wgmma_r & 7) * 128 + ((wgmma_lane >> 3) & 1) * 16"),
        f"{indent}}}",
    ])


def register_a_block(indent: str, kind: str, n: int, accumulator: str, a_registers: list[str], desc_b: str,
                     scale: str, lane: str) -> str:
    """A from four registers (used as they are), B MN-major from its descriptor: one
    ldmatrix.x4.trans per pair of n8 tiles gives b0, b1 (k 0-7) and b2, b3 (k 8-15) of both."""
    i1, i2 = indent + "    ", indent + "        "
    put = Statements(i2, kind, accumulator)
    return "\n".join([
        *_opening(indent, n),
        f"{i1}// 4 j .. 4 j + 3 are the C fragment of the n8 tile j. A is in registers: wgmma's register-A",
        f"{i1}// fragment in warp w is mma.m16n8k16's A fragment of rows 16 w .. 16 w + 15, used as it is.",
        f"{i1}// B is an MN-major tile with the 128-byte swizzle, read through its descriptor (start address,",
        f"{i1}// bits 0-13, in 16-byte units; k rows 128 bytes apart, 8-row groups of k the stride byte offset",
        f"{i1}// apart, bits 32-45; 64-column blocks of n the leading byte offset apart, bits 16-29) and",
        f"{i1}// transposed into B fragments by ldmatrix .trans.",
        f"{i1}const unsigned long long wgmma_db = {desc_b};",
        f"{i1}if ((wgmma_db >> 62) != 1 || ((wgmma_db >> 49) & 7) != 0)",
        f"{i2}{TRAP}",
        f"{i1}{SWIZZLE}",
        f"{i1}const unsigned wgmma_b0 = {_field('wgmma_db', 0)};",
        f"{i1}const unsigned wgmma_lb = {_field('wgmma_db', 16)};",
        f"{i1}const unsigned wgmma_sb = {_field('wgmma_db', 32)};",
        f"{i1}const unsigned wgmma_lane = {lane};",
        f"{i1}const unsigned wgmma_af[4] = {{{', '.join(a_registers)}}};  // a0 .. a7, two per register",
        *put.zero(scale, n),
        f"{i1}// lanes 8 m .. 8 m + 7 address the 8 k rows of matrix m: k 0-7 (m even) or 8-15 (m odd)",
        f"{i1}const unsigned wgmma_k = (wgmma_lane & 7) + (((wgmma_lane >> 3) & 1) << 3);",
        *put.tile_pairs(n, "const unsigned wgmma_n = 8 * wgmma_j + ((wgmma_lane >> 4) << 3);  "
                           "// matrices 0, 1: tile j; 2, 3: j + 1",
                        "wgmma_b0 + (wgmma_k >> 3) * wgmma_sb + (wgmma_k & 7) * 128 + (wgmma_n >> 6) * wgmma_lb + "
                        "(wgmma_n & 63) * 2", trans=True),
        f"{indent}}}",
    ])
