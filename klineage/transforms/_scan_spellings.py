"""Row loops spelled otherwise than the warp reductions read them (`_warp_reduction.py`), read as their forms, and
the row-loop values no lane of a warp would hold, refused with the reason; and the form a scan is read in (`Scan`,
`read_scan`: its accumulator, the value it combines, where it stores, its operation and that operation's identity
for a lane past the row's end), shared by those readings and the warp scans.

`respelled` writes a scan's update and store as the scan's two statements `acc += e; y[...j...] = acc;` (the store
first in an exclusive scan) where they are spelled `acc = acc + e` (`e + acc`, `*` too), through a temporary of the
accumulator's type that nothing else names (`float v = e; acc += v;`), or as the value of an assignment stored
(`y[...] = (acc += e);`, `y[...] = acc = acc + e;`): each computes the same values. A masked scan, `if (c) acc +=
e; y[...j...] = acc;`, is `acc += c ? e : 0.0f;` (`_masked_lines`). A running extreme kept by a compare, `if (e >
m) m = e; y[...j...] = m;` (or `m = e > m ? e : m;`, `<` for the least), is `m = fmaxf(m, e);` (`fminf`; `fmax`,
`fmin` for doubles) where m starts from a number (`-INFINITY`, a literal): a NaN e is taken by neither, m is never
NaN, so the two keep the same value, its zero's sign aside where a +0 and a -0 tie (the compare keeps the one it
has, fmaxf either: the same value, as the warp reductions' `max` of a kept extreme). `check_declared_apart` and
`check_accumulator_uses` refuse what a strided loop would change: an index or an updated variable declared apart
from where it is set (what `_c_style.py` left), an assignment inside a larger expression of a row loop (its value is
the serial running one), an accumulator's address taken or bound to a reference (a read through it sees one lane's
partial).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import (
    Edit,
    call_arguments,
    declared_kind,
    declared_names,
    edited,
    indentation,
    local_types,
    unparen,
    written_names,
)
from klineage.transforms._naive import squash, statements
from klineage.transforms.base import NotApplicable

SCAN_IDENTITY = {"+": "0", "*": "1"}  # what a lane past the row's end contributes to a running sum or product
_SCAN_OPERATORS = frozenset(SCAN_IDENTITY)
# a running extreme (cummax, cummin): fmaxf and its kin take the other value wherever one is NaN, so a quiet NaN of
# the accumulator's type is what a lane past the row's end contributes
SCAN_CALLS = frozenset({"fmaxf", "fminf", "fmax", "fmin"})
NAN = {"float": "__int_as_float(0x7fc00000)", "double": "__longlong_as_double(0x7ff8000000000000LL)"}


def scan_combined(op: str, first: str, second: str) -> str:
    """`first op second` for a running sum or product, `op(first, second)` for a running extreme."""
    return f"{first} {op} {second}" if op in SCAN_IDENTITY else f"{op}({first}, {second})"


def scan_update(op: str, accumulator: str, value: str) -> str:
    """The statement that combines `value` into `accumulator`: `acc += value;`, `acc = fmaxf(acc, value);`."""
    return f"{accumulator} {op}= {value};" if op in SCAN_IDENTITY else \
        f"{accumulator} = {scan_combined(op, accumulator, value)};"


@dataclass(frozen=True)
class Scan:
    """`acc += value; target = acc;`: the loop body of an inclusive prefix sum (`*=`, a prefix product); the store
    first (`target = acc; acc += value;`), an exclusive one. `count` is the row's length where the loop walks it from
    its end (`for (int j = count - 1; j >= 0; --j)`), else "". `cast`: the type the store converts the running value
    to (`y[j] = (float)acc;`, a float row summed in double), else ""."""

    accumulator: str
    value: str
    target: str
    op: str = "+"  # "+", "*" or a call of SCAN_CALLS (a running extreme)
    exclusive: bool = False
    count: str = ""
    cast: str = ""

    def stored(self, value: str) -> str:
        """`value` as the store converts it: `(float)(value)` where it casts, else as it is."""
        return f"({self.cast})({value})" if self.cast else value

    def __post_init__(self):
        if self.op not in SCAN_IDENTITY and self.op not in SCAN_CALLS:
            raise ValueError(f"a running sum, product or extreme, not `{self.op}`")

    def serial(self, index: str, bound: str, indent: str) -> str:
        """The serial loop (over `bound` columns, its body's two statements on lines of their own) at `indent`."""
        stored = f"({self.cast}){self.accumulator}" if self.cast else self.accumulator
        update, store = scan_update(self.op, self.accumulator, self.value), f"{self.target} = {stored};"
        header = f"for (int {index} = {bound} - 1; {index} >= 0; --{index})" if self.count else \
            f"for (int {index} = 0; {index} < {bound}; ++{index})"
        body = "".join(f"\n{indent}    {line}" for line in ((store, update) if self.exclusive else (update, store)))
        return f"{header} {{{body}\n{indent}}}"


def read_scan(parsed: cp.ParsedSource, loop_body: Node) -> Scan | None:
    """The running sum or product of `acc += value; target[...] = acc;` (`*=`; or the store first, an exclusive
    scan: exactly these two statements), else None."""
    listed = statements(loop_body)
    if len(listed) != 2 or any(s.type != "expression_statement" or not s.named_children for s in listed):
        return None
    first, second = (s.named_children[0] for s in listed)
    if first.type != "assignment_expression" or second.type != "assignment_expression":
        return None
    exclusive = first.child_by_field_name("left").type == "subscript_expression"
    update, store = (second, first) if exclusive else (first, second)
    accumulator = update.child_by_field_name("left")
    target, value = store.child_by_field_name("left"), store.child_by_field_name("right")
    combined = _scan_combine(parsed, update) if accumulator.type == "identifier" else None
    value = unparen(value)
    # the running value stored as it is, or converted by a cast (`(float)acc`: a sum kept in double)
    cast = squash(parsed.text(value.child_by_field_name("type"))) if value.type == "cast_expression" else ""
    stored = unparen(value.child_by_field_name("value")) if cast else value
    if (combined is None or target.type != "subscript_expression" or
            parsed.text(store.child_by_field_name("operator")) != "=" or
            parsed.text(stored) != parsed.text(accumulator)):
        return None
    op, added = combined
    if re.search(rf"\b{parsed.text(accumulator)}\b", f"{added} {parsed.text(target)}"):
        return None
    return Scan(parsed.text(accumulator), squash(added), squash(parsed.text(target)), op, exclusive, cast=cast)


def _scan_combine(parsed: cp.ParsedSource, update: Node) -> tuple[str, str] | None:
    """(op, the value combined) of a scan's update: `acc += e` (`*=`), or `acc = f(acc, e)` (`f(e, acc)`) for f of
    SCAN_CALLS; else None. e is checked elsewhere not to name acc."""
    operator = parsed.text(update.child_by_field_name("operator"))
    right = unparen(update.child_by_field_name("right"))
    if operator[:-1] in SCAN_IDENTITY and operator.endswith("="):
        return operator[:-1], parsed.text(right)
    if operator != "=" or right.type != "call_expression" or cp.call_name(right) not in SCAN_CALLS:
        return None
    arguments = [unparen(argument) for argument in call_arguments(right)]
    accumulator = parsed.text(update.child_by_field_name("left"))
    bare = [parsed.text(argument) == accumulator for argument in arguments]
    if len(arguments) != 2 or bare.count(True) != 1:
        return None
    return cp.call_name(right), parsed.text(arguments[bare.index(False)])


def respelled(state: KernelState, only: str | None = None) -> KernelState:
    """`state` with each scan that `_scan_lines` reads in a loop of its kernels (or of the kernel `only`) written as
    the scan's two statements, the spelling the warp reduction reads. The rewrite computes the same values, so what
    the legality decides on the result holds for the source."""
    return edited(state, lambda parsed, function, body: _scan_bodies(parsed, body), only)


def _scan_bodies(parsed: cp.ParsedSource, body: Node) -> list[Edit]:
    """Each loop body that `_scan_lines` reads as a scan spelled otherwise, as the scan's two statements."""
    types, starts = local_types(parsed, body), _numeric_starts(parsed, body)
    edits = []
    for loop in cp.nodes_of_type(body, "for_statement"):
        loop_body = loop.child_by_field_name("body")
        lines = _extreme_lines(parsed, loop_body, types, starts) or _scan_lines(parsed, loop_body, types)
        if lines is not None and lines != [squash(parsed.text(s)) for s in statements(loop_body)]:
            indent = indentation(parsed.data, loop.start_byte)
            text = "{" + "".join(f"\n{indent}    {line}" for line in lines) + f"\n{indent}}}"
            edits.append(Edit(loop_body.start_byte, loop_body.end_byte, text))
    return edits


def _scan_lines(parsed: cp.ParsedSource, loop_body: Node, types: dict[str, str]) -> list[str] | None:
    """The statements `acc op= value;` and `target = acc;` (the store first in an exclusive scan) of a loop body that
    computes them however spelled: the update `acc = acc op value` (or `value op acc`), the stored running value
    assigned in the store itself (`target = (acc += value)`, `target = acc = acc + value`: the value of an
    assignment is its variable's after it), the value first held by a temporary of the accumulator's type (`float v
    = e; acc += v;`, v named nowhere else: e converted as the scan's own `scan_value = e` converts it). None where
    the body is no such scan, op + or *."""
    listed = statements(loop_body)
    masked = _masked_lines(parsed, listed, types)
    if masked is not None:
        return masked
    temporary = listed.pop(0) if len(listed) in (2, 3) and listed[0].type == "declaration" else None
    if not listed or any(s.type != "expression_statement" or len(s.named_children) != 1 for s in listed):
        return None
    expressions = [s.named_children[0] for s in listed]
    if len(expressions) == 1:
        store = expressions[0]
        update = unparen(store.child_by_field_name("right")) if _is_assignment(parsed, store, "=") else None
        exclusive = False
    elif len(expressions) == 2:
        exclusive = _is_assignment(parsed, expressions[0], "=") and \
            expressions[0].child_by_field_name("left").type == "subscript_expression"
        store, update = expressions if exclusive else expressions[::-1]
    else:
        return None
    found = _update(parsed, update) if update is not None and _is_assignment(parsed, store, "=") else None
    if found is None:
        return None
    accumulator, op, value = found
    target = store.child_by_field_name("left")
    stored = unparen(store.child_by_field_name("right"))
    if target.type != "subscript_expression" or (len(expressions) == 2 and parsed.text(stored) != accumulator):
        return None
    return _scan_pair(parsed, loop_body, types, (temporary, 2), accumulator, value, target, exclusive,
                      lambda taken: f"{accumulator} {op}= {taken};")


# a start that is a number, never NaN: infinities, the largest finite values, decimal literals (a sign first)
_NUMBER = re.compile(r"^\(?-?\s*(?:INFINITY|FLT_MAX|DBL_MAX|HUGE_VALF?|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?)\)?$")
_EXTREME_CALLS = {("float", True): "fmaxf", ("float", False): "fminf", ("double", True): "fmax",
                  ("double", False): "fmin"}


def _numeric_starts(parsed: cp.ParsedSource, body: Node) -> set[str]:
    """The locals the body declares once, starting from a number (`float m = -INFINITY;`)."""
    names = declared_names(parsed, body)
    return {parsed.text(declarator.child_by_field_name("declarator"))
            for declaration in _block_declarations(body) for declarator in
            declaration.children_by_field_name("declarator") if declarator.type == "init_declarator" and
            names.count(parsed.text(declarator.child_by_field_name("declarator"))) == 1 and
            _NUMBER.match(squash(parsed.text(declarator.child_by_field_name("value"))))}


def _extreme_lines(parsed: cp.ParsedSource, loop_body: Node, types: dict[str, str],
                   starts: set[str]) -> list[str] | None:
    """`m = fmaxf(m, e); target = m;` (the store first in an exclusive scan) of a loop body that keeps a running
    extreme by a compare, `if (e > m) m = e;` or `m = e > m ? e : m;` (`<` for the least; either side; `>=` too),
    e maybe first held by a temporary of m's type; m a float or double starting from a number. None otherwise."""
    listed = statements(loop_body)
    temporary = listed.pop(0) if len(listed) == 3 and listed[0].type == "declaration" else None
    if len(listed) != 2:
        return None
    exclusive = listed[0].type == "expression_statement" and listed[0].named_children and \
        _is_assignment(parsed, listed[0].named_children[0], "=") and \
        listed[0].named_children[0].child_by_field_name("left").type == "subscript_expression"
    keep, store = listed[::-1] if exclusive else listed
    kept = _kept(parsed, keep)
    assignment = store.named_children[0] if store.type == "expression_statement" and store.named_children else None
    if kept is None or assignment is None or not _is_assignment(parsed, assignment, "="):
        return None
    accumulator, larger, value = kept
    call = _EXTREME_CALLS.get((types.get(accumulator, ""), larger))
    target = assignment.child_by_field_name("left")
    if call is None or accumulator not in starts or target.type != "subscript_expression" or \
            parsed.text(unparen(assignment.child_by_field_name("right"))) != accumulator:
        return None
    return _scan_pair(parsed, loop_body, types, (temporary, 3), accumulator, value, target, exclusive,
                      lambda taken: f"{accumulator} = {call}({accumulator}, {taken});")


def _scan_pair(parsed: cp.ParsedSource, loop_body: Node, types: dict[str, str], temporary: tuple[Node | None, int],
               accumulator: str, value: str, target: Node, exclusive: bool,
               update: Callable[[str], str]) -> list[str] | None:
    """The scan's two statements, `update(value)` and the store of the accumulator at `target` (the store first in
    an exclusive scan), the value taken from the temporary (a declaration, and how often the loop body names it:
    its declaration and its uses) where the update reads one; None where the temporary is not the value's alone or
    the value or the target name the accumulator."""
    declaration, mentions = temporary
    if declaration is not None:
        inlined = _temporary(parsed, declaration, types.get(accumulator))
        if inlined is None or inlined[0] != value or \
                len(re.findall(rf"\b{inlined[0]}\b", parsed.text(loop_body))) != mentions:
            return None
        value = inlined[1]
    if re.search(rf"\b{accumulator}\b", f"{value} {parsed.text(target)}"):
        return None
    lines = [update(value), f"{squash(parsed.text(target))} = {accumulator};"]
    return lines[::-1] if exclusive else lines


def _kept(parsed: cp.ParsedSource, statement: Node) -> tuple[str, bool, str] | None:
    """(m, whether it keeps the largest, e squashed) of `if (e > m) m = e;` (no else) or `m = e > m ? e : m;`, the
    compare either way round, strict or not; else None."""
    if statement.type == "if_statement" and statement.child_by_field_name("alternative") is None:
        condition = statement.child_by_field_name("condition")
        compare = unparen(condition.child_by_field_name("value") or condition)
        inner = statements(statement.child_by_field_name("consequence"))
        assignment = inner[0].named_children[0] if len(inner) == 1 and inner[0].type == "expression_statement" \
            and inner[0].named_children else None
        if assignment is None or not _is_assignment(parsed, assignment, "=") or \
                assignment.child_by_field_name("left").type != "identifier":
            return None
        taken, kept = unparen(assignment.child_by_field_name("right")), assignment.child_by_field_name("left")
    elif statement.type == "expression_statement" and statement.named_children and \
            _is_assignment(parsed, statement.named_children[0], "="):
        assignment = statement.named_children[0]
        choice = unparen(assignment.child_by_field_name("right"))
        if choice.type != "conditional_expression" or assignment.child_by_field_name("left").type != "identifier":
            return None
        compare = unparen(choice.child_by_field_name("condition"))
        taken, kept = unparen(choice.child_by_field_name("consequence")), \
            unparen(choice.child_by_field_name("alternative"))
        if parsed.text(kept) != parsed.text(assignment.child_by_field_name("left")):
            return None
    else:
        return None
    relation = parsed.text(compare.child_by_field_name("operator")) if compare.type == "binary_expression" else ""
    if relation not in (">", ">=", "<", "<="):
        return None
    sides = [squash(parsed.text(unparen(compare.child_by_field_name(side)))) for side in ("left", "right")]
    name, value = parsed.text(kept), squash(parsed.text(taken))
    if sorted(sides) != sorted([name, value]) or name == value:
        return None
    return name, (relation in (">", ">=")) == (sides[0] == value), value


def _masked_lines(parsed: cp.ParsedSource, listed: list[Node], types: dict[str, str]) -> list[str] | None:
    """The scan's two statements of a masked scan, `if (c) acc op= e; target = acc;` (the store first in an
    exclusive one; the `if` without `else`, c naming no accumulator): `acc op= c ? e : <identity>;`, which adds
    zero (multiplies by one) where the mask drops the element. Multiplying by one keeps every bit; adding zero
    does too but for a running sum of -0.0, which becomes +0.0, the same value (the warp reductions reassociate
    the sum anyway). None where the body is no such scan."""
    if len(listed) != 2 or [s.type for s in listed].count("if_statement") != 1:
        return None
    exclusive = listed[1].type == "if_statement"
    guard, store = listed[::-1] if exclusive else listed
    consequence = guard.child_by_field_name("consequence")
    inner = statements(consequence) if consequence is not None else []
    if guard.child_by_field_name("alternative") is not None or len(inner) != 1 or \
            inner[0].type != "expression_statement" or len(inner[0].named_children) != 1 or \
            store.type != "expression_statement" or len(store.named_children) != 1:
        return None
    found = _update(parsed, inner[0].named_children[0])
    assignment = store.named_children[0]
    if found is None or not _is_assignment(parsed, assignment, "="):
        return None
    accumulator, op, value = found
    identity = _IDENTITIES.get(types.get(accumulator, ""), {}).get(op)
    target = assignment.child_by_field_name("left")
    condition = squash(parsed.text(guard.child_by_field_name("condition")))
    if identity is None or target.type != "subscript_expression" or \
            parsed.text(unparen(assignment.child_by_field_name("right"))) != accumulator or \
            re.search(rf"\b{accumulator}\b", f"{value} {condition} {parsed.text(target)}"):
        return None
    lines = [f"{accumulator} {op}= {condition} ? ({value}) : {identity};",
             f"{squash(parsed.text(target))} = {accumulator};"]
    return lines[::-1] if exclusive else lines


# what a dropped element adds to a running sum or multiplies into a running product, in the accumulator's type
_IDENTITIES = {"float": {"+": "0.0f", "*": "1.0f"}, "double": {"+": "0.0", "*": "1.0"},
               "int": {"+": "0", "*": "1"}, "long long": {"+": "0", "*": "1"}}


def _update(parsed: cp.ParsedSource, node: Node) -> tuple[str, str, str] | None:
    """(accumulator, op, value) of `acc op= value`, `acc = acc op value` or `acc = value op acc` (op + or *:
    either order gives the same bits), value squashed; else None."""
    if node.type != "assignment_expression" or node.child_by_field_name("left").type != "identifier":
        return None
    accumulator = parsed.text(node.child_by_field_name("left"))
    operator = parsed.text(node.child_by_field_name("operator"))
    right = node.child_by_field_name("right")
    if operator[:1] in _SCAN_OPERATORS and operator[1:] == "=":
        return accumulator, operator[0], squash(parsed.text(right))
    right = unparen(right)
    if operator != "=" or right.type != "binary_expression" or \
            parsed.text(right.child_by_field_name("operator")) not in _SCAN_OPERATORS:
        return None
    sides = [right.child_by_field_name(side) for side in ("left", "right")]
    for acc, value in (sides, sides[::-1]):
        if parsed.text(unparen(acc)) == accumulator:
            return accumulator, parsed.text(right.child_by_field_name("operator")), squash(parsed.text(value))
    return None


def _temporary(parsed: cp.ParsedSource, declaration: Node, kind: str | None) -> tuple[str, str] | None:
    """(name, its value squashed) of `T v = e;` (or `const T`), one variable of the type `kind`; else None."""
    declarators = declaration.children_by_field_name("declarator")
    if kind is None or len(declarators) != 1 or declarators[0].type != "init_declarator" or \
            declarators[0].child_by_field_name("declarator").type != "identifier" or \
            declared_kind(parsed, declaration) not in (kind, f"const {kind}"):
        return None
    return (parsed.text(declarators[0].child_by_field_name("declarator")),
            squash(parsed.text(declarators[0].child_by_field_name("value"))))


def _is_assignment(parsed: cp.ParsedSource, node: Node, operator: str) -> bool:
    return node.type == "assignment_expression" and parsed.text(node.child_by_field_name("operator")) == operator


def _block_declarations(body: Node) -> list[Node]:
    """The declarations that are statements of a block (no loop's header)."""
    return [d for d in cp.nodes_of_type(body, "declaration") if d.parent is not None and
            d.parent.type == "compound_statement" and d.children_by_field_name("declarator")]


def _looped_names(parsed: cp.ParsedSource, body: Node) -> set[str]:
    """The names some loop's body assigns or increments."""
    return {name for loop in cp.nodes_of_type(body, "for_statement")
            for name in written_names(parsed, loop.child_by_field_name("body"))}


def check_declared_apart(parsed: cp.ParsedSource, body: Node) -> None:
    """What `_canonical.py` left declared apart from where it is set, as C declares locals (`_c_style.py`): a loop
    index named outside the loops that set it, a variable a loop updates declared without a value and not set by an
    assignment statement of its block before anything names it."""
    for loop in cp.nodes_of_type(body, "for_statement"):
        start = loop.child_by_field_name("initializer")
        if start is not None and start.type == "assignment_expression":
            header = squash(parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte].decode())
            raise NotApplicable(f"the index '{parsed.text(start.child_by_field_name('left'))}' of `{header}` is "
                                f"declared outside the loop and named outside the loops that set it (a lane would "
                                f"leave a strided loop with its own last index)")
    looped = _looped_names(parsed, body)
    for declaration in _block_declarations(body):
        for declarator in declaration.children_by_field_name("declarator"):
            if declarator.type == "identifier" and parsed.text(declarator) in looped:
                raise NotApplicable(f"'{parsed.text(declarator)}' is declared without a value and first named "
                                    f"other than by an assignment statement of its block: no start every lane "
                                    f"shares")


def check_accumulator_uses(parsed: cp.ParsedSource, body: Node, loops) -> None:
    """No value the lanes' partials would change is read: an assignment in a row loop is a statement of its own
    (the value of one inside an expression is the serial running value, which no lane holds), and no accumulator's
    address is taken or bound to a reference (a read through it would see one lane's partial)."""
    for loop in loops:
        # the loop's step, and those of a column's own loops inside it (`_warp_reduction._private_loop`)
        steps = [n.child_by_field_name("update") for n in cp.nodes_of_type(loop.node, "for_statement")]
        for node in cp.nodes_of_type(loop.node, "assignment_expression", "update_expression"):
            if node not in steps and node.parent.type != "expression_statement":
                written = unparen(node.child_by_field_name("left") or node.child_by_field_name("argument"))
                raise NotApplicable(f"'{parsed.text(written)}' is assigned inside a larger expression in a row loop "
                                    f"(`{squash(parsed.text(node.parent))}`): the value it gives is the serial "
                                    f"running one, which no lane holds")
    names = {acc.name for loop in loops for acc in loop.accumulators}
    for node in cp.nodes_of_type(body, "pointer_expression"):
        argument = parsed.text(unparen(node.child_by_field_name("argument")))
        if parsed.text(node).startswith("&") and argument in names:
            raise NotApplicable(f"the address of accumulator '{argument}' is taken (`{squash(parsed.text(node))}`): "
                                f"a read through it would see one lane's partial")
    for declarator in cp.nodes_of_type(body, "init_declarator"):
        bound = re.findall(r"[A-Za-z_]\w*", parsed.text(declarator.child_by_field_name("value"))) if \
            declarator.child_by_field_name("declarator").type == "reference_declarator" else []
        if named := sorted(names & set(bound)):
            raise NotApplicable(f"accumulator '{named[0]}' is bound to a reference (`{squash(parsed.text(declarator))}`"
                                f"): a read through it would see one lane's partial")
