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

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms import register
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Role, Transform

KNOB = re.compile(r"^(?:(?:BLOCK|TILE|WARP_TILE|WARPS|THREADS|VEC|VECTOR|GROUP|SPLIT|ROWS_PER|COLS_PER)(?:_\w+)?"
                  r"|(?:\w+_)?STAGES|\w+_WARPGROUPS|\w+_PER_(?:THREAD|WARP|BLOCK|SM)|\w*BATCH)$")
_TO_ONE = re.compile(r"^(?:(?:\w+_)?STAGES|VEC(?:_\w+)?|VECTOR(?:_\w+)?)$")
_VECTOR_WIDTH = re.compile(r"^(?:VEC|VECTOR)(?:_\w+)?$")
_INT_LITERAL = re.compile(r"^(?P<digits>[1-9]\d*|0)(?P<suffix>[uUlL]*)$")
_KEY = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?::(?P<old>\d+)->(?P<new>\d+)|=(?P<set>\d+))?$")
_INT_TYPES = re.compile(r"^(?:(?:un)?signed\s+)?(?:int|long|long long|short|size_t|u?int(?:8|16|32|64)_t|unsigned)$")
VECTOR_TYPES = ("float2", "float4", "int2", "int4", "uint2", "uint4", "double2", "half2", "__half2",
                "__nv_bfloat162", "nv_bfloat162", "longlong2", "ulonglong2", "char4", "uchar4", "short4")
_C_OPERATORS = {"&&": "and", "||": "or", "/": "//"}


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


def c_expression(parsed: cp.ParsedSource, node: Node) -> str:
    """A C constant expression as a `klineage.expr` expression; ExpressionError when it has no such form."""
    kind = node.type
    if kind == "number_literal":
        text = parsed.text(node).rstrip("uUlL")
        if re.fullmatch(r"0[0-7]+", text):
            text = "0o" + text[1:]
        if not re.fullmatch(r"0[xX][0-9a-fA-F]+|0o[0-7]+|\d+", text):
            raise ExpressionError(parsed.text(node), "not an integer literal")
        return text
    if kind in ("true", "false"):
        return "True" if kind == "true" else "False"
    if kind == "identifier":
        return parsed.text(node)
    if kind == "parenthesized_expression" and node.named_child_count == 1:
        return f"({c_expression(parsed, node.named_children[0])})"
    if kind == "unary_expression":
        operator = parsed.text(node.child_by_field_name("operator"))
        operand = c_expression(parsed, node.child_by_field_name("argument"))
        return f"(not {operand})" if operator == "!" else f"({operator}{operand})"
    if kind == "binary_expression":
        operator = parsed.text(node.child_by_field_name("operator"))
        left = c_expression(parsed, node.child_by_field_name("left"))
        right = c_expression(parsed, node.child_by_field_name("right"))
        return f"({left} {_C_OPERATORS.get(operator, operator)} {right})"
    if kind == "conditional_expression":
        condition, consequence, alternative = (c_expression(parsed, node.child_by_field_name(f))
                                               for f in ("condition", "consequence", "alternative"))
        return f"({consequence} if {condition} else {alternative})"
    raise ExpressionError(parsed.text(node), f"'{kind}' is not a plain arithmetic expression")


def _evaluate(parsed: cp.ParsedSource, node: Node, constants: dict) -> object:
    return expr.evaluate(c_expression(parsed, node), constants)


def _static_asserts(parsed: cp.ParsedSource) -> list[tuple[Node, str]]:
    found = []
    for node in cp.nodes_of_type(parsed.root, "static_assert_declaration"):
        condition = node.child_by_field_name("condition")
        message = node.child_by_field_name("message")
        if condition is not None:
            found.append((condition, cp.string_value(parsed, message) if message is not None else ""))
    return found


def _uses(parsed: cp.ParsedSource, node: Node, name: str) -> bool:
    return any(parsed.text(n) == name for n in cp.nodes_of_type(node, "identifier"))


def check(old: KernelState, new_source: str, name: str) -> None:
    """Raise NotApplicable where the new constants break a static_assert, an exact division or a vector type."""
    before = old.constants
    after = parse_constants(new_source)
    parsed = cp.parse(old.source)
    for condition, message in _static_asserts(parsed):
        try:
            held, holds = bool(_evaluate(parsed, condition, before)), bool(_evaluate(parsed, condition, after))
        except ExpressionError:
            continue
        if held and not holds:
            raise NotApplicable(f"tile_constant: {name} = {after.get(name)} breaks "
                                f"static_assert({parsed.text(condition)}) \"{message}\"")
    for declaration in cp.declarations(parsed):
        if declaration.init is None or not declaration.constant:
            continue
        for division in cp.nodes_of_type(declaration.init, "binary_expression"):
            if parsed.text(division.child_by_field_name("operator")) not in ("/", "%"):
                continue
            if not _uses(parsed, division, name):
                continue
            left, right = division.child_by_field_name("left"), division.child_by_field_name("right")
            try:
                a0, b0 = _evaluate(parsed, left, before), _evaluate(parsed, right, before)
                a1, b1 = _evaluate(parsed, left, after), _evaluate(parsed, right, after)
            except ExpressionError:
                continue
            if not all(isinstance(v, int) for v in (a0, b0, a1, b1)) or b0 == 0:
                continue
            if b1 == 0:
                raise NotApplicable(f"tile_constant: {name} = {after.get(name)} makes `{parsed.text(right)}` zero "
                                    f"in {declaration.name}")
            operator = parsed.text(division.child_by_field_name("operator"))
            if operator == "/" and a0 % b0 == 0 and a1 % b1 != 0:
                raise NotApplicable(f"tile_constant: {name} = {after.get(name)} makes {declaration.name}'s "
                                    f"`{parsed.text(division)}` inexact ({a1} / {b1})")
            if operator == "/" and a0 // b0 > 0 and a1 // b1 == 0:
                raise NotApplicable(f"tile_constant: {name} = {after.get(name)} makes {declaration.name}'s "
                                    f"`{parsed.text(division)}` zero")
    if _VECTOR_WIDTH.match(name):
        for function in cp.functions(parsed):
            if not _uses(parsed, function.node, name):
                continue
            types = {parsed.text(n) for n in cp.nodes_of_type(function.node, "type_identifier")}
            vector = sorted(types & set(VECTOR_TYPES))
            if vector:
                raise NotApplicable(f"tile_constant: {name} is the width of the {vector[0]} accesses in "
                                    f"{function.name}; changing it alone would read the wrong elements "
                                    f"(devectorize first)")


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
