"""A row loop that keeps the best value and where it was (argmax / argmin), and the warp shuffle that combines
(value, index) pairs so that the warp's answer is the sequential loop's to the bit.

The sequential form: `if (e > best) { best = e; at = j; }` (or `<` for the smallest; `best < e` reads the same),
the loop's only statement after local declarations. A strict compare keeps the first of equal values, never
takes a NaN, and keeps a NaN the loop starts from. Split over lanes (each from the same start value), every
lane's pair is either that start pair or a column that beat it strictly; so two pairs of equal value are both
start pairs or both columns, and the combine - the better value, on equal values the smaller index - is the
sequential answer: the first column of the best value, or the start pair where none beat it (a NaN start stays:
nothing compares above or equal to it). Signed zeros compare equal, so the earlier one wins, as in the loop.

`if (e >= best) { ... }` (`<=`) keeps the last of equal values instead, and takes a column equal to the start. Its
lanes hold the start pair or a column at least as good; the combine takes, on equal values, the larger index. That
is the loop's answer wherever the start's index is below every column's (`at = -1` or `at = 0` before a loop from
1): a column equal to the start then wins the tie, as the loop takes it. The warp reductions check that (or an
index equal to the first column's where the start is an infinity or the largest finite value, which no other
value's bits can tie).

People also keep only the index and read the best value back through it, `if (row[c] < row[best]) best = c;`.
`held_best` reads that as the form above, the value held by a local read where the loop starts:

    float best_value = row[best];
    for (int c = 1; c < cols; ++c)
        if (row[c] < best_value) { best_value = row[c]; best = c; }

The local always equals `row[best]` (the loop writes nothing else and the array is only read), so each compare
sees the same two values and the rewrite keeps every bit. The one new read is of the start's element before the
loop, which the loop's first compare reads anyway wherever the row has an element past the start.

People also write the update as two selections, the index first: `at = v > best ? j : at; best = v > best ? v :
best;`. `chosen_best` reads that as the `if` above: the first selection leaves `best` as it was, so both compare the
same two values, and each takes its new value exactly where the `if` would. The value chosen first (its compare
then sees the new best) is left as written.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import Edit, declared_kind, edited, indentation, unparen
from klineage.transforms._naive import parameters, squash, statements

_BETTER = {">": "max", "<": "min", ">=": "max", "<=": "min"}
_MIRROR = {">": "<", "<": ">", ">=": "<=", "<=": ">="}
PAIR_VALUE, PAIR_INDEX = "pair_value", "pair_index"
_HELD_TYPES = frozenset({"float", "double", "int", "long long", "unsigned", "unsigned int"})  # values a local holds
_LOOP_INDEX = re.compile(r"^for \((?:int|long long|long|size_t|unsigned|unsigned int) ([A-Za-z_]\w*) = [^;]+;")
# the butterfly over a whole warp; a layout whose lanes share a row in groups passes its own header and mask
WARP_BUTTERFLY, FULL_MASK = "for (int offset = 16; offset > 0; offset /= 2)", "0xffffffffu"


@dataclass(frozen=True)
class ArgBest:
    """`if (candidate <compare> value) { value = candidate; index = <loop index>; }`."""

    value: str
    index: str
    compare: str  # ">" keeps the largest, "<" the smallest; ">=", "<=" the last of equal values

    def __post_init__(self):
        if self.compare not in _BETTER:
            raise ValueError(f"an arg reduction compares with >, <, >= or <=, not {self.compare!r}")

    @property
    def last(self) -> bool:
        """Whether equal values go to the later column."""
        return self.compare.endswith("=")


def arg_best(parsed: cp.ParsedSource, loop_body: Node, loop_index: str) -> ArgBest | None:
    """The loop body's arg reduction (locals declared first, then the one `if`), else None."""
    listed = [s for s in statements(loop_body) if s.type != "declaration"]
    if len(listed) != 1 or listed[0].type != "if_statement" or listed[0].child_by_field_name("alternative"):
        return None
    condition = listed[0].child_by_field_name("condition")
    while condition is not None and condition.type in ("parenthesized_expression", "condition_clause"):
        condition = condition.named_children[0] if condition.named_children else None
    if condition is None or condition.type != "binary_expression":
        return None
    compare = parsed.text(condition.child_by_field_name("operator"))
    left, right = condition.child_by_field_name("left"), condition.child_by_field_name("right")
    if compare not in _BETTER:
        return None
    if right.type == "identifier":
        candidate, value = left, parsed.text(right)
    elif left.type == "identifier":
        candidate, value, compare = right, parsed.text(left), _MIRROR[compare]
    else:
        return None
    updates = _assignments(parsed, listed[0].child_by_field_name("consequence"))
    if updates is None or len(updates) != 2 or value not in updates:
        return None
    index = next(name for name in updates if name != value)
    if squash(updates[value]) != squash(parsed.text(candidate)) or updates[index] != loop_index:
        return None
    text = parsed.text(loop_body)
    if len(re.findall(rf"\b{value}\b", text)) != 2 or len(re.findall(rf"\b{index}\b", text)) != 1:
        return None  # the candidate or a local reads the value or the index
    return ArgBest(value, index, compare)


def _assignments(parsed: cp.ParsedSource, node: Node) -> dict[str, str] | None:
    """name -> assigned text of a block of plain `name = e;` statements, else None."""
    found = {}
    for statement in statements(node):
        assignment = statement.named_children[0] if statement.type == "expression_statement" and \
            statement.named_children else None
        if assignment is None or assignment.type != "assignment_expression" or \
                parsed.text(assignment.child_by_field_name("operator")) != "=" or \
                assignment.child_by_field_name("left").type != "identifier":
            return None
        name = parsed.text(assignment.child_by_field_name("left"))
        if name in found:
            return None
        found[name] = parsed.text(assignment.child_by_field_name("right"))
    return found


def pair_butterfly(arg: ArgBest, value_type: str, index_type: str, indent: str, header: str = WARP_BUTTERFLY,
                   mask: str = FULL_MASK) -> str:
    """The butterfly (`header`, over the lanes of `mask`) that leaves every lane with its lanes' best (value, index):
    the better value, on equal values the smaller index."""
    return tuple_butterfly({arg.value: value_type, arg.index: index_type}, (PAIR_VALUE, PAIR_INDEX),
                           pair_join(arg, PAIR_VALUE, PAIR_INDEX), indent, header, mask)


def tuple_butterfly(kinds: dict[str, str], shuffled: tuple[str, ...], joined: list[str], indent: str, header: str,
                    mask: str) -> str:
    """The butterfly (`header`, over the lanes of `mask`) that shuffles each accumulator of `kinds` (name -> type)
    into a local of `shuffled`, in order, and runs `joined`, the statements that join those into the accumulators:
    the form of every fold of a tuple (an arg reduction's pair, an online maximum's, Welford's triple)."""
    lines = [f"{header} {{",
             *(f"    const {kind} {local} = __shfl_xor_sync({mask}, {name}, offset);"
               for (name, kind), local in zip(kinds.items(), shuffled, strict=True)),
             *(f"    {line}" for line in joined),
             "}"]
    return "\n".join(indent + line for line in lines)[len(indent):]


def pair_join(arg: ArgBest, value: str, index: str) -> list[str]:
    """The statements that take the pair (`value`, `index`) where it is the better one: the better value, on equal
    values the smaller index, or the larger where the loop keeps the last (the same answer in whichever order pairs
    are joined)."""
    tie = ">" if arg.last else "<"
    return [f"if ({value} {arg.compare[0]} {arg.value} || ({value} == {arg.value} && {index} {tie} {arg.index})) {{",
            f"    {arg.value} = {value};",
            f"    {arg.index} = {index};",
            "}"]


def is_pair_butterfly(text: str, header: str = WARP_BUTTERFLY, mask: str = FULL_MASK) -> bool:
    """Whether `text` (a for statement) is exactly what pair_butterfly writes with this header and mask."""
    match = re.match(rf"^{re.escape(header)} \{{ const ([\w ]+?) {PAIR_VALUE} = __shfl_xor_sync\({re.escape(mask)}, "
                     rf"(\w+), offset\); const ([\w ]+?) {PAIR_INDEX} = __shfl_xor_sync\({re.escape(mask)}, (\w+), "
                     rf"offset\); if \({PAIR_VALUE} ([<>]) ", squash(text))
    if match is None:
        return False
    value_type, value, index_type, index, compare = match.groups()
    return any(squash(text) == squash(pair_butterfly(ArgBest(value, index, kept), value_type, index_type, "", header,
                                                     mask)) for kept in (compare, f"{compare}="))


def held_best(state: KernelState, only: str | None = None) -> KernelState:
    """`state` with each loop of its kernels (or of the kernel `only`) that keeps only the best index and reads the
    best value back through it (`if (x[e(j)] < x[e(best)]) best = j;`) written to hold that value in a local (see
    the module's docstring); the same state where none does."""
    def held(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[Edit]:
        taken = {parsed.text(node) for node in cp.nodes_of_type(function.node, "identifier")}
        elements = element_types(parsed, function)
        return [found for loop in cp.nodes_of_type(body, "for_statement")
                for found in _held(parsed, loop, elements, taken)]

    return edited(state, held, only)


def chosen_best(state: KernelState, only: str | None = None) -> KernelState:
    """`state` with each loop of its kernels (or of the kernel `only`) that keeps its best value and index by two
    selections, the index's first (`at = e > best ? j : at; best = e > best ? e : best;`), written as the `if` the
    arg reductions read (see the module's docstring); the same state where none does."""
    def chosen(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[Edit]:
        found = []
        for loop in cp.nodes_of_type(body, "for_statement"):
            listed = statements(loop.child_by_field_name("body"))
            for first, second in zip(listed, listed[1:]):
                picked = [_selection(parsed, statement) for statement in (first, second)]
                if None in picked:
                    continue
                (at, condition, index, kept_at), (best, condition_2, value, kept_best) = picked
                if condition != condition_2 or kept_at != at or kept_best != best or at == best or \
                        re.search(rf"\b{at}\b", f"{condition} {value} {index}") or \
                        not re.search(rf"\b{best}\b", condition) or re.search(rf"\b{best}\b", value):
                    continue
                indent = indentation(parsed.data, first.start_byte)
                found.append(Edit(first.start_byte, second.end_byte,
                                  f"if ({condition}) {{\n{indent}    {best} = {value};\n{indent}    {at} = {index};"
                                  f"\n{indent}}}"))
        return found

    return edited(state, chosen, only)


def _selection(parsed: cp.ParsedSource, statement: Node) -> tuple[str, str, str, str] | None:
    """(target, condition, chosen, kept) of `target = condition ? chosen : kept;`, texts squashed; else None."""
    node = statement.named_children[0] if statement.type == "expression_statement" and \
        statement.named_child_count == 1 else None
    if node is None or node.type != "assignment_expression" or \
            parsed.text(node.child_by_field_name("operator")) != "=" or \
            node.child_by_field_name("left").type != "identifier":
        return None
    choice = unparen(node.child_by_field_name("right"))
    if choice.type != "conditional_expression":
        return None
    return (parsed.text(node.child_by_field_name("left")),
            *(squash(parsed.text(unparen(choice.child_by_field_name(part))))
              for part in ("condition", "consequence", "alternative")))


def element_types(parsed: cp.ParsedSource, function: cp.Function) -> dict[str, str]:
    """Each pointer the kernel takes or declares once (`const float* row = x + r * n;`) -> its element's type."""
    found = {name: kind.removeprefix("const ").strip() for name, kind, pointer in parameters(parsed, function)
             if pointer}
    declared: list[str] = []
    for declaration in cp.nodes_of_type(function.node.child_by_field_name("body"), "declaration"):
        for declarator in declaration.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else None
            name = inner.child_by_field_name("declarator") if inner is not None and \
                inner.type == "pointer_declarator" else None
            if name is not None and name.type == "identifier":
                declared.append(parsed.text(name))
                found[parsed.text(name)] = declared_kind(parsed, declaration).removeprefix("const ").strip()
    return {name: kind for name, kind in found.items() if declared.count(name) < 2}


def _held(parsed: cp.ParsedSource, loop: Node, elements: dict[str, str], taken: set[str]) -> list[Edit]:
    """The edits that hold a read-back best value of `loop` in a local; none where the loop is no such reduction."""
    index = _LOOP_INDEX.match(squash(parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte]
                                     .decode("utf-8")))
    listed = statements(loop.child_by_field_name("body"))
    if index is None or len(listed) != 1 or listed[0].type != "if_statement" or \
            listed[0].child_by_field_name("alternative") is not None:
        return []
    choice, index = listed[0], index[1]
    condition = unparen(choice.child_by_field_name("condition"))
    while condition.type == "condition_clause" and condition.named_children:
        condition = unparen(condition.named_children[0])
    compare = parsed.text(condition.child_by_field_name("operator")) if condition.type == "binary_expression" \
        else ""
    sides = [unparen(condition.child_by_field_name(side)) for side in ("left", "right")] if compare in _BETTER \
        else []
    if len(sides) != 2 or any(side.type != "subscript_expression" for side in sides):
        return []
    arrays = {parsed.text(side.child_by_field_name("argument")) for side in sides}
    array = arrays.pop() if len(arrays) == 1 else ""
    updates = _assignments(parsed, choice.child_by_field_name("consequence")) or {}
    best = next((name for name, value in updates.items() if value == index), "") if len(updates) == 1 else ""
    at = [squash(parsed.text(side.child_by_field_name("indices"))) for side in sides]
    moved = [re.sub(rf"\b{index}\b", best, text) for text in at]
    candidate = next((i for i in (0, 1) if best and moved[i] == at[1 - i] and moved[i] != at[i]), None)
    kind = elements.get(array, "")
    if candidate is None or kind not in _HELD_TYPES or \
            len(re.findall(rf"\b{best}\b", parsed.text(loop.child_by_field_name("body")))) != 2:
        return []
    name = next(f"{best}_value{n or ''}" for n in range(len(taken) + 1) if f"{best}_value{n or ''}" not in taken)
    taken.add(name)
    read = f"{array}{parsed.text(sides[candidate].child_by_field_name('indices'))}"
    sides_text = (read, name) if candidate == 0 else (name, read)
    indent = indentation(parsed.data, loop.start_byte)
    inner = indentation(parsed.data, choice.start_byte)
    return [Edit(loop.start_byte, loop.start_byte,
                 f"{kind} {name} = {array}{parsed.text(sides[1 - candidate].child_by_field_name('indices'))};\n"
                 f"{indent}"),
            Edit(choice.start_byte, choice.end_byte,
                 f"if ({sides_text[0]} {compare} {sides_text[1]}) {{\n{inner}    {name} = {read};\n{inner}    "
                 f"{best} = {index};\n{inner}}}")]
