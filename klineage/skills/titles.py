"""A card's title in the forward direction ("use mma.sync") and where it acts ("mma_f16_16816").

Transforms are named for the walk's backward step (`scalarize_mma` removes tensor-core MMAs), but a
card teaches the forward one, which the catalog states as each transform's `intent`. The verb
phrases below shorten those intents; `tests/test_card_titles.py` holds every catalog entry to one
and each phrase to a term its intent uses, so a new transform without a title fails there rather
than showing a backward name. Several cards share one transform: the anchor's function and key
tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# transform name -> (forward verb phrase, a term of the transform's intent the phrase stands for)
FORWARD: dict[str, tuple[str, str]] = {
    "block_swizzle": ("group blocks by tile rows for L2 reuse", "groups of tile rows"),
    "devectorize": ("vectorize global accesses", "widest aligned vector accesses"),
    "fast_math": ("use fast math intrinsics", "fast hardware approximation"),
    "fix_grid_cap": ("size a grid-stride kernel's grid to the GPU's SMs", "in proportion to the GPU's SMs"),
    "launch_bounds": ("bound the block size (__launch_bounds__)", "block size"),
    "ldg": ("load read-only data with __ldg", "__ldg"),
    "ldg_subscript": ("read a read-only array through the read-only cache", "read-only cache"),
    "reroll_grid_stride": ("unroll a grid-stride loop a few grids a step", "loads of several elements together"),
    "reciprocal_constant": ("multiply by a constant's folded reciprocal", "reciprocal"),
    "restrict": ("restrict-qualify pointers", "__restrict__"),
    "scalarize_elementwise": ("move four elements per thread as 16-byte vectors", "16-byte vector loads and stores"),
    "scalarize_grid_stride": ("walk a grid-stride loop four elements a step as 16-byte vectors",
                              "four elements a step"),
    "scalarize_half_packs": ("move eight 16-bit elements per thread as 16-byte packs", "16-byte loads and stores"),
    "scalarize_ldmatrix": ("use ldmatrix", "ldmatrix"),
    "scalarize_mma": ("use mma.sync", "mma.sync"),
    "scalarize_row_cache": ("fill and write a row cache 16 bytes a lane at a time", "16 bytes a lane at a time"),
    "scalarize_row_gather": ("move 16 bytes of a gathered row per thread", "16 bytes of a row per thread"),
    "scalarize_row_walk": ("walk a row four columns a lane per step as float4", "four consecutive columns per step"),
    "serialize_block_reduction": ("reduce each row across a block", "a shared slot a warp"),
    "serialize_column_reduction": ("reduce each column across four lanes of a warp", "four lanes"),
    "serialize_reduction": ("reduce each row across a warp", "warp shuffles"),
    "shuffle_to_shared": ("exchange lanes with warp shuffles", "register shuffles"),
    "sync_copies": ("copy to shared memory with cp.async", "cp.async"),
    "tile_constant": ("tune a tile constant", "tile, vector, warp, thread or stage count"),
    "uncache_row": ("keep a row in registers across passes", "in registers"),
    "uncoarsen": ("coarsen threads", "small fixed batch"),
    "uncoarsen_grid_stride": ("loop grid-stride over elements on fewer blocks", "grid-stride loop"),
    "unsplit_reduction": ("split a long reduction into chunks merged by a second launch", "chunks"),
    "unaggregate_atomics": ("make one atomic per warp after a shuffle fold", "single atomic per warp"),
    "unblock_matmul": ("compute a 4x4 micro-tile of a product per thread", "4x4 micro-tile"),
    "unpad_shared": ("pad shared-memory rows", "Pad the row stride"),
    "unpipeline": ("pipeline copies through shared-memory stages", "ring of STAGES"),
    "unprivatize_histogram": ("count a histogram in a shared-memory copy per block", "shared-memory copy of the bins"),
    "unroll": ("unroll a loop", "unroll"),
    "unstage_shared": ("stage a tile in shared memory", "Stage a tile"),
    "untile_matmul": ("stage a matrix product's operands in shared-memory tiles", "16x16 shared-memory tiles"),
    "untile_transpose": ("transpose through a padded shared-memory tile", "padded 32x33 shared-memory tile"),
    "unswizzle_shared": ("swizzle shared-memory tiles", "XOR swizzle"),
    "unshuffle_block_reduction": ("reduce a block through warp shuffles", "one shared slot a warp"),
    "warp_mma": ("use wgmma", "wgmma"),
}


@dataclass(frozen=True)
class CardTitle:
    """`verb` in `where`: "restrict-qualify pointers" in "store_tile: y"; `where` is code, shown as such."""

    verb: str
    where: str

    def __str__(self) -> str:
        return f"{self.verb} in {self.where}" if self.where else self.verb


def forward_verb(transform: str, intent: str = "") -> str:
    """The forward phrase for a transform; one outside the table reads as its intent's first clause."""
    if transform in FORWARD:
        return FORWARD[transform][0]
    clause = intent.split(" (")[0].split(":")[0].split(",")[0].rstrip(".").strip()
    return clause[:1].lower() + clause[1:] if clause else transform


def anchor_where(anchor: dict[str, Any]) -> str:
    """The site, short: the function, and the key's name where it is not the function itself. Keys
    carry a JSON tail on some transforms (`xv#0 {"dir": ...}`), a kind suffix (`i#0:unroll`) or
    arguments (`launch_bounds(THREADS, 2)`): only the name before them is shown."""
    function = anchor.get("function", "") or ""
    key = (anchor.get("key", "") or "").split(" ", 1)[0].split(":", 1)[0].split("(", 1)[0]
    if function in ("", "<file>"):
        return key
    if key in ("", function):
        return function
    return f"{function}: {key}"


def card_title(transform: str, anchor: dict[str, Any], intent: str = "") -> CardTitle:
    return CardTitle(forward_verb(transform, intent), anchor_where(anchor))
