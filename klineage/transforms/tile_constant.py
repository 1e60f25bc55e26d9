"""tile_constant: change one tuning constant (a tile, vector, warp, thread or stage count).

Carrier tuning, not a skill (Role.CARRIER): a walk shrinks tiles to see which mechanism needs them.

Sites: namespace-scope constants initialised with a plain integer literal whose names read as
tuning knobs: BLOCK_*, TILE_*, WARP_TILE_*, WARPS_*, THREADS(_*), STAGES / *_STAGES, VEC(_*),
VECTOR_*, GROUP_*, SPLIT_*, ROWS_PER_*, COLS_PER_*, *_PER_THREAD, *_PER_WARP, *_PER_BLOCK,
*_PER_SM, *_WARPGROUPS, *_BATCH; as `constexpr int NAME = 128;` (any integer type, const or constexpr) or
`#define NAME 128`. Derived constants (`THREADS = WARPS_M * WARPS_N * 32`) are not sites: change
what they derive from.

Anchor: function "<file>", kind "declaration" (or "macro"), key `NAME:OLD->NEW`. find proposes
the default step: half the value (1 for STAGES and VEC constants), where that is a whole number
other than the value itself. The key also accepts `NAME` (the default step from the value found)
and `NAME=NEW` (any value). backward sets NEW; forward, on `NAME:OLD->NEW`, sets OLD back (on
`NAME` it doubles the value; `NAME=NEW` has no record of the old value, so forward cannot undo it).
The carrier records old and new values.

The plan needs no change: its expressions name the constants and read them from the source.

NotApplicable when the new value would break what the kernel states about it:
  - a `static_assert` that holds with the old constants and fails with the new ones (evaluated with
    `klineage.expr` over the constants parsed from the source; asserts over anything else, such as
    sizeof or template parameters, cannot be evaluated and are skipped);
  - a constant derived by an exact division (`WARP_M = BLOCK_M / WARPS_M`) that would no longer be
    exact, or a derived count that would drop to zero;
  - a vector-width constant (VEC*) used in a function that also uses a vector type (float4, uint4,
    ...): the width is tied to that type, and changing one without the other reads the wrong
    elements (devectorizing is its own transform).
Anything beyond these (a hard-coded 4 next to a VEC, a loop that assumes BLOCK_K / 16 steps) only
the gate finds: a carrier change is checked on the GPU like any other rewrite.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._constants import check
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

KNOB = re.compile(r"^(?:(?:BLOCK|TILE|WARP_TILE|WARPS|THREADS|VEC|VECTOR|GROUP|SPLIT|ROWS_PER|COLS_PER)(?:_\w+)?"
                  r"|(?:\w+_)?STAGES|\w+_WARPGROUPS|\w+_PER_(?:THREAD|WARP|BLOCK|SM)|\w*BATCH)$")
_TO_ONE = re.compile(r"^(?:(?:\w+_)?STAGES|VEC(?:_\w+)?|VECTOR(?:_\w+)?)$")
_INT_LITERAL = re.compile(r"^(?P<digits>[1-9]\d*|0)(?P<suffix>[uUlL]*)$")
_KEY = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?::(?P<old>\d+)->(?P<new>\d+)|=(?P<set>\d+))?$")
_INT_TYPES = re.compile(r"^(?:(?:un)?signed\s+)?(?:int|long|long long|short|size_t|u?int(?:8|16|32|64)_t|unsigned)$")


class _Constant:
    def __init__(self, name: str, kind: str, value: int, literal: Node, digits: tuple[int, int]):
        self.name, self.kind, self.value, self.literal, self.digits = name, kind, value, literal, digits


def _constants(parsed: cp.ParsedSource) -> list[_Constant]:
    """Knob constants initialised by an integer literal, in source order."""
    found = []
    for declaration in cp.declarations(parsed):
        if declaration.function is not None or declaration.init is None or declaration.indirection or declaration.dims:
            continue
        if not declaration.constant or not _INT_TYPES.match(declaration.type) or not KNOB.match(declaration.name):
            continue
        literal = declaration.init
        match = _INT_LITERAL.match(parsed.text(literal)) if literal.type == "number_literal" else None
        if match is not None:
            start = literal.start_byte
            found.append(_Constant(declaration.name, "declaration", int(match["digits"]), literal,
                                   (start, start + len(match["digits"]))))
    for macro in cp.macros(parsed):
        value = macro.node.child_by_field_name("value")
        if macro.params is not None or value is None or not KNOB.match(macro.name):
            continue
        text = parsed.text(value)
        match = _INT_LITERAL.match(text.strip())
        if match is not None:
            start = value.start_byte + (len(text) - len(text.lstrip()))
            found.append(_Constant(macro.name, "macro", int(match["digits"]), value,
                                   (start, start + len(match["digits"]))))
    return found


def default_step(name: str, value: int) -> int | None:
    """The value backward proposes: half (1 for stage and vector counts), or None when there is none."""
    new = 1 if _TO_ONE.match(name) else (value // 2 if value % 2 == 0 else 0)
    return new if 0 < new != value else None


class TileConstant(Transform):
    name = "tile_constant"
    intent = "Pick the tile, vector, warp, thread or stage count that fits the problem and the GPU."
    role = Role.CARRIER

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for constant in _constants(parsed):
            new = default_step(constant.name, constant.value)
            if new is not None:
                line_start = parsed.data.rfind(b"\n", 0, constant.literal.start_byte) + 1
                line_end = parsed.data.find(b"\n", constant.literal.end_byte)
                snippet = parsed.data[line_start:line_end if line_end >= 0 else None].decode("utf-8", "replace")
                anchors.append(Anchor("<file>", constant.kind, f"{constant.name}:{constant.value}->{new}",
                                      snippet.strip()))
        return anchors

    def _site(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[_Constant, re.Match]:
        match = _KEY.match(anchor.key) if anchor.kind in ("declaration", "macro") else None
        if match is None:
            raise NotApplicable(f"tile_constant needs a declaration anchor keyed `NAME:OLD->NEW`, `NAME` or "
                                f"`NAME=NEW`, not {anchor}")
        for constant in _constants(parsed):
            if constant.name == match["name"]:
                return constant, match
        raise NotApplicable(f"tile_constant: no tuning constant {match['name']} set by an integer literal")

    def _set(self, state: KernelState, parsed: cp.ParsedSource, anchor: Anchor, constant: _Constant, value: int,
             direction: Direction) -> Rewrite:
        if value <= 0:
            raise NotApplicable(f"tile_constant: {constant.name} must stay positive, not {value}")
        if value == constant.value:
            raise NotApplicable(f"tile_constant: {constant.name} is already {value}")
        start, end = constant.digits
        data = parsed.data
        source = (data[:start] + str(value).encode() + data[end:]).decode("utf-8")
        check(state, source, constant.name)
        return self.rewrite(state, anchor, direction, source,
                            carrier={"constant": constant.name, "old": constant.value, "new": value},
                            note=f"{constant.name}: {constant.value} -> {value}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        constant, match = self._site(parsed, anchor)
        if match["old"] is not None:
            if int(match["old"]) != constant.value:
                raise NotApplicable(f"tile_constant: {constant.name} is {constant.value} here, not {match['old']}")
            value = int(match["new"])
        elif match["set"] is not None:
            value = int(match["set"])
        else:
            step = default_step(constant.name, constant.value)
            if step is None:
                raise NotApplicable(f"tile_constant: {constant.name} = {constant.value} has no smaller step "
                                    f"(odd, or already 1)")
            value = step
        return self._set(state, parsed, anchor, constant, value, Direction.BACKWARD)

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        constant, match = self._site(parsed, anchor)
        if match["set"] is not None:
            raise NotApplicable(f"tile_constant: `{anchor.key}` records no old value of {constant.name} to restore")
        if match["old"] is not None:
            if int(match["new"]) != constant.value:
                raise NotApplicable(f"tile_constant: {constant.name} is {constant.value} here, not {match['new']}")
            value = int(match["old"])
        else:
            value = constant.value * 2
        return self._set(state, parsed, anchor, constant, value, Direction.FORWARD)


register(TileConstant())
