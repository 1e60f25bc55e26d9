"""C-style spellings of a kernel's locals and loops, read as the C++ spellings the analysis forwards know.

The forwards read a thread's loop over a row or over the grid by its `for` header (`for (int j = 0; j < cols;
++j)`) and an accumulator by its initialized declaration (`float sum = 0.0f;`). People also write C's way: locals
declared together at the top and set later, a `while` loop that steps its index last, an index declared once
before the loops and reset by each (a layer norm's three passes over a row):

    float sum, squares;                          int j;
    int j = 0;                                   sum = 0;
    sum = 0;                                     for (j = 0; j < cols; ++j) sum += x[j];
    while (j < cols) { sum += x[j]; ++j; }       squares = 0;
    squares = 0;                                 for (j = 0; j < cols; ++j) squares += ...;
    j = 0;
    while (j < cols) { ...; ++j; }

`declared_where_set` declares such a local where it is first set: a local of a declaration without values whose
first appearance after it is a statement `sum = v;` of the same block, or of a block inside it that holds every
later use (a guard's body, a loop's), becomes `float sum = v;` there (and leaves the declaration, which goes once it
declares nothing). Nothing read it before (that statement is its first use), and every later use stands after that
statement inside its block, which runs the statement first each time it runs (a loop's body every iteration), so
the local holds the same value wherever it is read.

`counted_for_loops` rewrites each counted loop of an index as `for (int j = 0; j < cols; ++j) <work>`, the index's
declaration and its resets gone. The loops run the same:
- a `while` loop tests its condition, runs its work and then its step, as the `for` loop does, where the work
  cannot skip the step (`continue` would: refused) nor write the index itself; its start is the index's last
  setting before it (`j = 0;`, or the declaration's value), with nothing between naming the index, and a start
  that calls nothing where statements stand between (they ran before it and now run after);
- each loop starts the index afresh (the `for` loop's `j = 0`, the `while` loop's start), and nothing outside the
  loops and their starts names the index (a read after a loop would see the last value: refused), so a local
  index per loop holds every value the shared one held where it is read;
- the declaration's own value is dropped only where it is a literal or a name (no effect lost) or the start of a
  `while` loop; no other local of the function has the index's name, and the declaration is a plain local of one
  name (not `static`, not `__shared__`).
`sequenced_statements` writes a statement of comma-joined expressions (`best = v, at = j;`) as one statement per
expression, braced where it was a branch's or a loop's whole body: the comma operator runs its operands in order,
as statements run, and the value of the whole is unused.
`joined_guards` (not part of `c_style`) writes a guard whose whole body is another guard, `if (a) { if (b) S }`, as
`if (a && b) S` (neither has an `else`): `&&` evaluates b only where a holds, as the inner guard did.
`plain_updates` writes a `for` header's unit step `j += 1` (or `j = j + 1`) as `++j`, whose value the header drops
too, its bound `j <= n - 1` as `j < n` and `j <= n` as `j < n + 1` where j is declared there of a signed type and n
is an integer literal, a scalar parameter or a local declared once of a signed type, never assigned (the two differ
only where n - 1 or n + 1 overflows, which a signed type may not; an unsigned n of 0 would make n - 1 the largest
value, so it is left alone; a causal row's `j <= i`), and an accumulation `x = x + e` (or
`x = e + x`) of a named local as `x += e`: the compound assignment reads x once and adds e's value, and IEEE addition
commutes, so the sum is the same to the bit. `x = x + a + b` adds a first and is left alone.
`subscripted` reads a pointer declared as the address of an element, `float* out = &y[r * n];`, as `float* out = y +
r * n;`, one declared in parentheses a macro put there, `((y) + (r) * D)`, as `y + (r) * D`, and a dereference of a
pointer plus an offset, `*(x + i)`, as `x[i]`: C++ defines `a[e]` as `*(a + e)` and `&*p` as `p`, so each names the
same element or address.
Any other spelling is left as written.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import (
    declared_kind,
    edited,
    is_written,
    line_end,
    line_start,
    local_types,
    operator,
    params,
    splice,
    unparen,
    written_names,
)

# a step `j++`, `++j`, `j--`, `j += e`, `j = j + e` ... of the index j (texts with blanks squashed)
_STEP = r"(?:{j}\+\+|\+\+{j}|{j}--|--{j}|{j} [-+*]= .+|{j} = {j} [-+*] .+)"


def counted_for_loops(state: KernelState) -> KernelState:
    """`state` with the counted loops of each function's one-name locals declaring their own index (the module's
    docstring says which); the same state where there is none."""
    parsed = cp.parse(state.source)
    edits = []
    for function in cp.functions(parsed):
        if function.node.child_by_field_name("body") is None:
            continue
        for declaration in cp.nodes_of_type(function.node, "declaration"):
            local = _single_local(parsed, declaration)
            if local is not None and declaration.parent.type == "compound_statement":
                edits += _loops_of(parsed, function, declaration, *local)
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _squash(parsed: cp.ParsedSource, node: Node) -> str:
    return " ".join(parsed.text(node).split())


def _single_local(parsed: cp.ParsedSource, declaration: Node) -> tuple[str, str, Node | None] | None:
    """(type, name, value node or None) of a declaration of one plain local; None for anything else."""
    declarators = declaration.children_by_field_name("declarator")
    if len(declarators) != 1:
        return None
    declarator = declarators[0]
    value = declarator.child_by_field_name("value") if declarator.type == "init_declarator" else None
    name = declarator.child_by_field_name("declarator") if value is not None else declarator
    if name is None or name.type != "identifier":
        return None
    kind = declared_kind(parsed, declaration)
    if not kind or {"static", "__shared__", "extern"} & set(kind.split()):
        return None
    return kind, parsed.text(name), value


def _assigned(parsed: cp.ParsedSource, expression: Node | None, index: str) -> str | None:
    """S of an expression `index = S`, else None."""
    if expression is None or expression.type != "assignment_expression" or \
            parsed.text(expression.child_by_field_name("operator")) != "=" or \
            parsed.text(expression.child_by_field_name("left")) != index:
        return None
    return parsed.text(expression.child_by_field_name("right"))


def _start(parsed: cp.ParsedSource, statement: Node | None, index: str) -> str | None:
    """S of a statement `index = S;`, else None."""
    alone = statement is not None and statement.type == "expression_statement" and statement.named_child_count == 1
    return _assigned(parsed, statement.named_children[0], index) if alone else None


def _setting(parsed: cp.ParsedSource, loop: Node, index: str) -> tuple[Node | None, bool]:
    """The statement of the loop's block that last names `index` before the loop, and whether other statements
    stand between."""
    between, sibling = False, loop.prev_named_sibling
    while sibling is not None and not re.search(rf"\b{re.escape(index)}\b", parsed.text(sibling)):
        between |= sibling.type != "comment"
        sibling = sibling.prev_named_sibling
    return sibling, between


def _loops_of(parsed: cp.ParsedSource, function: cp.Function, declaration: Node, kind: str, index: str,
              value: Node | None) -> list[tuple[int, int, str]]:
    """The edits that give each counted loop over `index` (declared by `declaration`) its own index, or none where
    some use of the index is not a loop's or its start's."""
    uses = [n for n in cp.nodes_of_type(function.node, "identifier") if parsed.text(n) == index]
    spans, edits, value_used = [declaration], [], False
    for loop in cp.nodes_of_type(function.node, "while_statement", "for_statement"):
        if loop.type == "for_statement":
            initializer = loop.child_by_field_name("initializer")
            if _assigned(parsed, initializer, index) is None:
                continue
            spans.append(loop)
            edits.append((initializer.start_byte, initializer.end_byte, f"{kind} {parsed.text(initializer)}"))
            continue
        before, between = _setting(parsed, loop, index)
        start = _start(parsed, before, index)
        if start is None and before == declaration and value is not None:
            start, value_used = parsed.text(value), True
        moved = between and start is not None and "(" in start  # a call's effect would move past what stands between
        rewritten = _while_as_for(parsed, loop, kind, index, start) if start is not None and not moved else None
        if rewritten is None:
            continue
        spans += [before, loop]
        edits += rewritten
        if before != declaration:
            edits.append(_removed_line(parsed, before))
    declared = [n for n in uses if n.parent.type in ("init_declarator", "declaration")]
    if len(spans) == 1 or len(declared) != 1 or not all(
            any(span.start_byte <= n.start_byte and n.end_byte <= span.end_byte for span in spans) for n in uses):
        return []
    if value is not None and not value_used and value.type not in ("number_literal", "identifier"):
        return []  # a value with a possible effect no loop starts from
    return [_removed_line(parsed, declaration), *edits]


def _removed_line(parsed: cp.ParsedSource, node: Node) -> tuple[int, int, str]:
    """The edit that takes `node` away: its whole line where nothing else stands on it, else with the blanks
    before it."""
    start, end = line_start(parsed.data, node.start_byte), line_end(parsed.data, node.end_byte)
    if parsed.data[start:node.start_byte].strip() or parsed.data[node.end_byte:end].strip():
        blank = len(parsed.data[:node.start_byte]) - len(parsed.data[:node.start_byte].rstrip(b" \t"))
        return node.start_byte - blank, node.end_byte, ""
    return start, end, ""


def _while_as_for(parsed: cp.ParsedSource, loop: Node, kind: str, index: str,
                  start: str) -> list[tuple[int, int, str]] | None:
    """The edits that make a counted `while` loop over `index`, started at `start`, the `for` loop declaring it;
    None where its body does not end in the index's step, may skip that step, or writes the index otherwise."""
    body = loop.child_by_field_name("body")
    inside = [child for child in body.named_children if child.type != "comment"] \
        if body is not None and body.type == "compound_statement" else []
    step = inside[-1] if inside else None
    stepping = step.named_children[0] if step is not None and step.type == "expression_statement" and \
        step.named_child_count == 1 else None  # one update: `j += 1, y[j] = v;` does more
    if stepping is None or stepping.type not in ("update_expression", "assignment_expression") or not re.fullmatch(
            _STEP.format(j=re.escape(index)), _squash(parsed, stepping)):
        return None
    if re.search(r"\bcontinue\b", parsed.text(body)) or any(
            parsed.text(n) == index and is_written(n) for n in cp.nodes_of_type(body, "identifier")
            if not step.start_byte <= n.start_byte < step.end_byte):
        return None
    condition = _squash(parsed, loop.child_by_field_name("condition"))[1:-1].strip()
    header = f"for ({kind} {index} = {start}; {condition}; {_squash(parsed, step).removesuffix(';')}) "
    return [(loop.start_byte, body.start_byte, header), _removed_line(parsed, step)]


def declared_where_set(state: KernelState) -> KernelState:
    """`state` with each local of a declaration without values declared where it is first set (the module's
    docstring says when); the same state where there is none."""
    parsed = cp.parse(state.source)
    edits = []
    for function in cp.functions(parsed):
        body = function.node.child_by_field_name("body")
        for declaration in cp.nodes_of_type(body, "declaration") if body is not None else []:
            edits += _late_locals(parsed, function, declaration)
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _inside(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def _late_locals(parsed: cp.ParsedSource, function: cp.Function, declaration: Node) -> list[tuple[int, int, str]]:
    declarators = declaration.children_by_field_name("declarator")
    if declaration.parent.type != "compound_statement" or not declarators or \
            any(d.type != "identifier" for d in declarators):
        return []
    kind = declared_kind(parsed, declaration)
    if not kind or {"static", "__shared__", "extern", "const"} & set(kind.split()):
        return []
    identifiers = cp.nodes_of_type(function.node, "identifier")
    moved = {}
    for declarator in declarators:
        name = parsed.text(declarator)
        later = [n for n in identifiers if parsed.text(n) == name and n.start_byte > declarator.end_byte]
        if not later or len([n for n in identifiers if parsed.text(n) == name and
                             n.parent.type in ("init_declarator", "declaration")]) != 1:
            continue
        first = later[0].parent.parent  # `name = v;`: the identifier, its assignment, the statement
        block = first.parent if first is not None else None
        if block is None or block.type != "compound_statement" or _start(parsed, first, name) is None or \
                not _inside(block, declaration.parent) or not all(_inside(n, block) for n in later):
            continue
        moved[name] = first
    if not moved:
        return []
    kept = [parsed.text(d) for d in declarators if parsed.text(d) not in moved]
    edits = [_removed_line(parsed, declaration) if not kept else
             (declaration.start_byte, declaration.end_byte, f"{kind} {', '.join(kept)};")]
    edits += [(first.start_byte, first.start_byte, f"{kind} ") for first in moved.values()]
    return edits


def sequenced_statements(state: KernelState) -> KernelState:
    """`state` with each statement of comma-joined expressions written as one statement per expression (the module's
    docstring); the same state where there is none."""
    parsed = cp.parse(state.source)
    edits = []
    for statement in cp.nodes_of_type(parsed.root, "expression_statement"):
        joined = statement.named_children[0] if statement.named_child_count == 1 else None
        if joined is None or joined.type != "comma_expression" or cp.function_of(statement) is None:
            continue
        text = " ".join(f"{parsed.text(part)};" for part in _operands(joined))
        braced = statement.parent is not None and statement.parent.type != "compound_statement"
        edits.append((statement.start_byte, statement.end_byte, f"{{ {text} }}" if braced else text))
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _operands(node: Node) -> list[Node]:
    """The operands of a comma expression in order, however it nests."""
    if node.type != "comma_expression":
        return [node]
    return [*_operands(node.child_by_field_name("left")), *_operands(node.child_by_field_name("right"))]


def plain_updates(state: KernelState) -> KernelState:
    """`state` with a `for` header's unit step `j += 1` or `j = j + 1` written `++j`, and an accumulation `x = x + e`
    or `x = e + x` written `x += e`, where x is a name (the module's docstring); the same state where there is none."""
    parsed = cp.parse(state.source)
    edits = []
    for loop in cp.nodes_of_type(parsed.root, "for_statement"):
        update = loop.child_by_field_name("update")
        found = _UNIT_STEP.fullmatch(_squash(parsed, update)) if update is not None else None
        if found is not None and cp.function_of(loop) is not None:
            edits.append((update.start_byte, update.end_byte, f"++{found['j']}"))
        edits += _bound_below(parsed, loop)
    for assignment in cp.nodes_of_type(parsed.root, "assignment_expression"):
        target, value = assignment.child_by_field_name("left"), assignment.child_by_field_name("right")
        if target is None or target.type != "identifier" or value is None or value.type != "binary_expression" or \
                operator(value) != "+" or assignment.parent.type != "expression_statement" or \
                cp.function_of(assignment) is None:
            continue
        left, right = value.child_by_field_name("left"), value.child_by_field_name("right")
        name = parsed.text(target)
        # IEEE addition commutes, so `e + x` is `x + e` to the bit; `x + a + b` is `(x + a) + b`, left alone
        added = right if parsed.text(left) == name else left if parsed.text(right) == name else None
        if added is not None and not any(edit[0] <= assignment.start_byte < edit[1] for edit in edits):
            edits.append((assignment.start_byte, assignment.end_byte, f"{name} += {parsed.text(added)}"))
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


_UNIT_STEP = re.compile(r"(?P<j>[A-Za-z_]\w*) (?:\+= 1|= (?P=j) \+ 1|= 1 \+ (?P=j))")
_SIGNED = r"(?:const )?(?:int|long long|long|int64_t|int32_t|ptrdiff_t|long long int|long int)"
_AT_MOST = re.compile(r"(?P<j>[A-Za-z_]\w*) <= (?P<n>[A-Za-z_]\w*|\d+)(?P<less> - 1)?")


def _bound_below(parsed: cp.ParsedSource, loop: Node) -> list[tuple[int, int, str]]:
    """The edit writing the loop's condition `j <= n - 1` as `j < n`, or `j <= n` as `j < n + 1`, where the module's
    docstring allows it."""
    condition, start = loop.child_by_field_name("condition"), loop.child_by_field_name("initializer")
    function = cp.enclosing_function(loop)
    found = _AT_MOST.fullmatch(_squash(parsed, condition)) if condition is not None else None
    if found is None or function is None or start is None or start.type != "declaration" or \
            not re.fullmatch(rf"{_SIGNED} {found['j']} = .+;?", _squash(parsed, start)):
        return []
    signed = {param.name for param in params(parsed, function)
              if not param.indirection and re.fullmatch(_SIGNED, " ".join(param.type.split()))}
    # a local declared once of a signed type (a row index `int i = ...`)
    signed |= {name for name, kind in local_types(parsed, function.child_by_field_name("body")).items()
               if re.fullmatch(_SIGNED, kind)}
    n = found["n"]
    if not (n.isdigit() or n in signed) or n in written_names(parsed, function):
        return []
    bound = n if found["less"] else str(int(n) + 1) if n.isdigit() else f"{n} + 1"
    return [(condition.start_byte, condition.end_byte, f"{found['j']} < {bound}")]


def subscripted(state: KernelState) -> KernelState:
    """`state` with each pointer declared as an element's address read as the pointer plus the offset, and each
    `*(p + e)` of a pointer p read as `p[e]` (the module's docstring); the same state where there is none."""
    def edits(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> list[tuple[int, int, str]]:
        pointers = {param.name for param in params(parsed, function.node) if param.indirection} | {
            parsed.text(node.child_by_field_name("declarator")) for node in cp.nodes_of_type(body, "pointer_declarator")
            if node.child_by_field_name("declarator").type == "identifier"}
        found = []
        for declarator in cp.nodes_of_type(body, "init_declarator"):
            value = declarator.child_by_field_name("value")
            base = _parenthesized_base(parsed, value, pointers) if value is not None and \
                declarator.child_by_field_name("declarator").type == "pointer_declarator" else None
            if base is not None:  # `((p) + (r) * D)`, a macro's row pointer: `p + (r) * D`
                found.append((value.start_byte, value.end_byte, base))
                continue
            target = unparen(value.child_by_field_name("argument")) if value is not None and \
                value.type == "pointer_expression" and operator(value) == "&" else None
            if declarator.child_by_field_name("declarator").type == "pointer_declarator" and target is not None and \
                    target.type == "subscript_expression" and \
                    parsed.text(target.child_by_field_name("argument")) in pointers:
                index = parsed.text(target.child_by_field_name("indices"))[1:-1].strip()
                found.append((value.start_byte, value.end_byte,
                              f"{parsed.text(target.child_by_field_name('argument'))} + {index}"))
        for node in cp.nodes_of_type(body, "pointer_expression"):
            inner = unparen(node.child_by_field_name("argument"))
            if operator(node) != "*" or inner.type != "binary_expression" or operator(inner) != "+" or \
                    node.child_by_field_name("argument").type != "parenthesized_expression":
                continue
            sides = [inner.child_by_field_name(side) for side in ("left", "right")]
            named = [side for side in sides if side.type == "identifier" and parsed.text(side) in pointers]
            if len(named) == 1:
                offset = parsed.text(sides[1 - sides.index(named[0])])
                found.append((node.start_byte, node.end_byte, f"{parsed.text(named[0])}[{offset}]"))
        return found

    return edited(state, edits)


def _parenthesized_base(parsed: cp.ParsedSource, value: Node, pointers: set[str]) -> str | None:
    """`p + e` for a pointer's initial value `(p + e)` or `((p) + e)` (p a pointer, parentheses a macro put there),
    else None: the same address without the parentheses. Read from the text: the grammar cannot tell `(p) + e` from
    a cast of `+e` to a type p, which the compiler, knowing p names a pointer, never takes it for."""
    text = _squash(parsed, value)
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1]
    found = re.fullmatch(r"\(?([A-Za-z_]\w*)\)? \+ (.+)", text)
    if found is None or found[1] not in pointers or not _balanced(found[2]):
        return None
    plain = f"{found[1]} + {found[2]}"
    return None if plain == _squash(parsed, value) else plain


def _balanced(text: str) -> bool:
    """Whether every parenthesis of `text` closes one it opened."""
    depth = 0
    for character in text:
        depth += {"(": 1, ")": -1}.get(character, 0)
        if depth < 0:
            return False
    return depth == 0


def joined_guards(state: KernelState) -> KernelState:
    """`state` with a guard whose whole body is another guard, `if (a) { if (b) S }` (no `else` on either), written
    `if (a && b) S`: `&&` tests b only where a holds, as the nested guards do; the same state where there is none."""
    parsed = cp.parse(state.source)
    edits = []
    for outer in cp.nodes_of_type(parsed.root, "if_statement"):
        inner = _lone_statement(outer.child_by_field_name("consequence"))
        if inner is None or inner.type != "if_statement" or cp.function_of(outer) is None or \
                outer.child_by_field_name("alternative") is not None or \
                inner.child_by_field_name("alternative") is not None or \
                any(edit[0] <= outer.start_byte < edit[1] for edit in edits):
            continue
        conditions = [parsed.text(node.child_by_field_name("condition"))[1:-1].strip() for node in (outer, inner)]
        joined = " && ".join(f"({c})" if re.search(r"\|\||\?|,", c) else c for c in conditions)
        edits.append((outer.start_byte, outer.end_byte,
                      f"if ({joined}) {parsed.text(inner.child_by_field_name('consequence'))}"))
    if not edits:
        return state
    return KernelState(source=splice(parsed.data, edits)[0].decode("utf-8"), plan=state.plan)


def _lone_statement(node: Node | None) -> Node | None:
    """The one statement a branch holds (braced or not), None where it holds more or none."""
    if node is None or node.type != "compound_statement":
        return node
    held = [child for child in node.named_children if child.type != "comment"]
    return held[0] if len(held) == 1 else None


def c_style(state: KernelState) -> KernelState:
    """`state` with its C spellings read as C++ ones: element addresses and dereferences as subscripts, comma-joined
    statements one by one, unit steps and
    accumulations in their short forms, locals declared where set, counted loops as `for` loops that declare their
    index (the module's docstring). Guards stay nested: an inner guard is what some forwards read (the condition of
    a counted atomic, a histogram's bin bounds); a forward that reads bounds alone joins them (`joined_guards`)."""
    return counted_for_loops(declared_where_set(plain_updates(sequenced_statements(subscripted(state)))))
