"""A running maximum with a sum rescaled to it (the one-pass softmax normalizer), and the warp shuffle that joins two
lanes' (maximum, sum) pairs.

The serial form takes one column a step:

    float m_new = fmaxf(m, v);
    s = s * expf(m - m_new) + expf(v - m_new);
    m = m_new;

m is the largest value so far and s the sum of exp(x - m) over the values so far. Split over lanes, each from the
same start (s from zero), a lane holds (m, s) over its own columns; two pairs join as M = fmaxf(m_a, m_b) and
S = s_a * exp(m_a - M) + s_b * exp(m_b - M), a pair whose maximum is M already taken as it is (the factor would be
one), so that a lane that saw no column (m still -INFINITY, s zero) adds nothing instead of NaN. Both lanes of a
shuffle join the same two pairs, so every lane ends with the same (M, S). The sum is taken in another order and
rescaled at other points than the serial loop's, as every lane's partial sum is: the gate judges the result against
the problem's tolerance.

Read where the loop body is local declarations, then those three statements in that order (the maximum by fmaxf,
fmax or max, either argument first; the update's two terms in either order, the factor on either side; expf, __expf
or exp), the three names distinct and named nowhere else in the body. The same fold is often written with a branch,

    if (v > m) { s = s * expf(m - v) + 1.0f; m = v; } else { s += expf(v - m); }

which keeps the same (m, s) after every column (where v is the new maximum, exp(v - v) is the one added; else the
old sum's factor exp(m - m) is one): read too, as the declarations and then that one `if`, m and s named nowhere
else in the body. The lanes run the loop's body as written either way; only the join is added.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._arg_reduction import tuple_butterfly
from klineage.transforms._edit import call_arguments, unparen
from klineage.transforms._naive import squash, statements

_MAXIMA = frozenset({"fmaxf", "fmax", "max"})
_EXPONENTIALS = ("expf", "__expf", "exp")
_ONES = ("1.0f", "1.0", "1.f", "1")  # exp(v - v), as the branch adds it
PAIR_MAX, PAIR_SUM, PAIR_JOINED = "pair_max", "pair_sum", "pair_joined"


@dataclass(frozen=True)
class OnlineMax:
    """The loop keeps `maximum` and `total`, the sum of exp(x - maximum), calling `exp`."""

    maximum: str
    total: str
    exp: str

    def __post_init__(self):
        if self.exp not in _EXPONENTIALS:
            raise ValueError(f"an online maximum rescales with {', '.join(_EXPONENTIALS)}, not {self.exp!r}")


def online_max(parsed: cp.ParsedSource, loop_body: Node) -> OnlineMax | None:
    """The loop body's running maximum and rescaled sum (see the module's docstring), else None."""
    listed = statements(loop_body)
    if listed and listed[-1].type == "if_statement" and all(s.type == "declaration" for s in listed[:-1]):
        return _branched(parsed, loop_body, listed[-1])
    while listed and listed[0].type == "declaration" and len(listed) > 3:
        listed = listed[1:]
    if len(listed) != 3 or listed[0].type != "declaration":
        return None
    declarators = listed[0].children_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value") if len(declarators) == 1 else None
    call = unparen(value) if value is not None else None
    if call is None or call.type != "call_expression" or cp.call_name(call) not in _MAXIMA or \
            len(call_arguments(call)) != 2:
        return None
    new = parsed.text(declarators[0].child_by_field_name("declarator"))
    arguments = [squash(parsed.text(unparen(a))) for a in call_arguments(call)]
    for maximum, element in (arguments, arguments[::-1]):
        total = _rescaled(parsed, listed[1], maximum, new, element)
        if total is None or squash(parsed.text(listed[2])) != f"{maximum} = {new};":
            continue
        names = (maximum, total[0], new)
        body = [parsed.text(n) for n in cp.nodes_of_type(loop_body, "identifier")]
        if len(set(names)) == 3 and all(name.isidentifier() for name in names) and \
                body.count(maximum) == 3 and body.count(total[0]) == 2 and body.count(new) == 4:
            return OnlineMax(maximum, *total)
    return None


def _branched(parsed: cp.ParsedSource, loop_body: Node, choice: Node) -> OnlineMax | None:
    """The fold written with a branch (`if (v > m) { s = s * exp(m - v) + 1.0f; m = v; } else { s += exp(v - m); }`,
    the compare either way round, the sum's terms in either order), else None."""
    condition = unparen(choice.child_by_field_name("condition"))
    while condition.type == "condition_clause" and condition.named_children:
        condition = unparen(condition.named_children[0])
    if condition.type != "binary_expression" or choice.child_by_field_name("alternative") is None:
        return None
    sides = [squash(parsed.text(unparen(condition.child_by_field_name(side)))) for side in ("left", "right")]
    compare = parsed.text(condition.child_by_field_name("operator"))
    element, maximum = sides if compare == ">" else sides[::-1] if compare == "<" else ("", "")
    kept = statements(choice.child_by_field_name("consequence"))
    if not maximum.isidentifier() or len(kept) != 2 or squash(parsed.text(kept[1])) != f"{maximum} = {element};":
        return None
    total = squash(parsed.text(kept[0])).split(" = ", 1)[0]
    other = squash(parsed.text(choice.child_by_field_name("alternative"))).removeprefix("else ").strip("{} ")
    for exp in _EXPONENTIALS:
        scaled, added = f"{total} * {exp}({maximum} - {element})", f"{exp}({element} - {maximum})"
        updates = {f"{total} = {a} + {b};" for one in _ONES for a, b in ((scaled, one), (one, scaled))}
        others = (f"{total} += {added};", f"{total} = {total} + {added};", f"{total} = {added} + {total};")
        if squash(parsed.text(kept[0])) in updates and other in others:
            names = [parsed.text(n) for n in cp.nodes_of_type(loop_body, "identifier")]
            inside = [parsed.text(n) for n in cp.nodes_of_type(choice, "identifier")]
            if total.isidentifier() and total != maximum and names.count(maximum) == inside.count(maximum) and \
                    names.count(total) == inside.count(total):
                return OnlineMax(maximum, total, exp)
    return None


def _rescaled(parsed: cp.ParsedSource, statement: Node, maximum: str, new: str,
              element: str) -> tuple[str, str] | None:
    """(the sum, the exponential) where `statement` is `s = s * exp(maximum - new) + exp(element - new);` spelled
    any of the ways the module's docstring lists; else None."""
    text = squash(parsed.text(statement))
    total = text.split(" = ", 1)[0]
    for exp in _EXPONENTIALS:
        kept, added = f"{exp}({maximum} - {new})", f"{exp}({element} - {new})"
        for scaled in (f"{total} * {kept}", f"{kept} * {total}"):
            if text in (f"{total} = {scaled} + {added};", f"{total} = {added} + {scaled};"):
                return total, exp
    return None


def online_butterfly(online: OnlineMax, kind: str, indent: str, header: str, mask: str) -> str:
    """The butterfly (`header`, over the lanes of `mask`) that leaves every lane with its lanes' (maximum, sum)
    joined."""
    return tuple_butterfly({online.maximum: kind, online.total: kind}, (PAIR_MAX, PAIR_SUM),
                           online_join(online, kind, PAIR_MAX, PAIR_SUM), indent, header, mask)


def online_join(online: OnlineMax, kind: str, maximum: str, total: str) -> list[str]:
    """The statements that join the pair (`maximum`, `total`) into the accumulators: the larger maximum, each sum
    rescaled to it (a sum already at it taken as it is)."""
    m, s, exp = online.maximum, online.total, online.exp
    larger = "fmaxf" if kind == "float" else "fmax"
    return [f"const {kind} {PAIR_JOINED} = {larger}({m}, {maximum});",
            f"{s} = ({m} == {PAIR_JOINED} ? {s} : {s} * {exp}({m} - {PAIR_JOINED})) + ({maximum} == {PAIR_JOINED} ? "
            f"{total} : {total} * {exp}({maximum} - {PAIR_JOINED}));",
            f"{m} = {PAIR_JOINED};"]


def is_online_butterfly(parsed: cp.ParsedSource, node: Node, header: str, mask: str) -> bool:
    """Whether `node` (a for statement) is exactly what online_butterfly writes with this header and mask."""
    listed = statements(node.child_by_field_name("body"))
    if len(listed) != 5 or listed[0].type != "declaration":
        return False
    kind = squash(parsed.text(listed[0].child_by_field_name("type")))
    maximum, total = (squash(parsed.text(s)).rsplit(" = ", 1)[0] for s in listed[3:5][::-1])
    exp = next((e for e in _EXPONENTIALS if f" * {e}({maximum} - {PAIR_JOINED})" in parsed.text(listed[3])), None)
    return exp is not None and squash(parsed.text(node)) == squash(
        online_butterfly(OnlineMax(maximum, total, exp), kind, "", header, mask))
