"""unpipeline: collapse a multi-stage cp.async pipeline into a single-stage loop.

The pipeline is one unit: a ring of STAGES shared-memory stages (STAGES a namespace-scope
constant), a prologue loop that issues the copies of STAGES - 1 tiles (`for (...; s < STAGES - 1;
...)`, one commit group each), and a main loop that waits with `wait_group(STAGES - 2)` (a wait
helper's template or call argument, or `__pipeline_wait_prior`), passes a barrier, and refills the
stage freed by the previous iteration with one commit group per iteration.

Anchor: the function holding the pipeline, kind "loop", key `<index>#<n>:<STAGES>`: the main
loop's index variable, its ordinal among the function's loops over that variable, and the ring's
stage-count constant (`kt#0:STAGES`).

Backward gives a single-stage loop in which every tile is copied after the barrier that ends the
reads of the previous one, and read only after `wait_group 0` and a barrier:
- STAGES becomes 1 (carrier: the old depth), so every ring index (`kt % STAGES`, `(s + 1 ==
  STAGES) ? 0 : s + 1`) is stage 0, and every wait of the pipeline waits for all groups (`0`).
- Where the main loop's wait heads its body (the wait guards the tile the iteration computes):
  the prologue goes; the refill statements (from the first copy to the commit) move up to right
  after the declarations they use, the wait and barrier follow them, and a barrier closes the
  body: load tile kt, wait all, barrier, compute, barrier.
- Where the wait sits in the last step of an inner, unrolled loop over k-steps (it guards the tile
  of the next iteration; the refill is spread over the earlier steps as `if (ks == c)` blocks): the
  prologue issues one tile (`STAGES - 1` becomes `1`), and the refill blocks, unwrapped, move with
  the declarations only they use to right before that wait, behind a new barrier; their lookahead
  `kt + STAGES - 1` becomes `kt + 1`.
- Static asserts that a pipeline has two stages go; one that says another user of the dynamic
  shared memory (the epilogue's staging tile) fits in the ring goes too, and the plan's shared
  expression becomes max(ring, that size). The plan's shared memory shrinks with STAGES.
The rewrite checks that every statement the refill moves across neither writes what the refill
reads nor reads what it writes (a call's plain arguments count as written), and that the
declarations moved ahead of the wait compute without calls, subscripts or dereferences.

There is no mechanical forward: where the expert issued its refill (after the first MMAs, spread
over k-steps), its prologue and its comments are design choices the single-stage loop no longer
shows; an LLM must materialize the pipeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms import register
from klineage.transforms._async_copy import COMMIT, COPY, WAIT, AsyncRoles, async_roles, c_value, short_name, wait_count
from klineage.transforms._edit import (
    Edit,
    first_line,
    indentation,
    item_span,
    leading_start,
    line_end,
    line_start,
    own_lines,
    reindent,
    splice,
)
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform, with_plan

_KEY = re.compile(r"^(?P<var>[^#:]+)#(?P<n>\d+):(?P<ring>\w+)$")
_BARRIER_NOTE = "every warp is done reading the stage before it is refilled"
_SIZE_TEXT = re.compile(r"^[\w\s+*()-]+$")


# ---------------------------------------------------------------------------------------------
# Small views of the tree
# ---------------------------------------------------------------------------------------------


def loop_variable(parsed: cp.ParsedSource, loop: Node) -> str:
    """A loop's index: the name its initializer declares or assigns, else the loop's kind."""
    if loop.type == "for_statement":
        init = loop.child_by_field_name("initializer")
        if init is not None and init.type == "declaration":
            names = [n for n in cp.nodes_of_type(init, "identifier") if n.parent.type in ("init_declarator",)]
            if names:
                return parsed.text(names[0])
        if init is not None and init.type == "assignment_expression":
            left = init.child_by_field_name("left")
            if left is not None and left.type == "identifier":
                return parsed.text(left)
        return "for"
    return {"while_statement": "while", "do_statement": "do"}.get(loop.type, "for")


def _loops_by_key(parsed: cp.ParsedSource, function: Node) -> list[tuple[str, Node]]:
    counts: dict[str, int] = {}
    found = []
    for node in cp.nodes_of_type(function, "for_statement", "while_statement", "do_statement", "for_range_loop"):
        var = loop_variable(parsed, node)
        n = counts.get(var, 0)
        counts[var] = n + 1
        found.append((f"{var}#{n}", node))
    return found


def _items(block: Node) -> list[Node]:
    """The statements of a block: comments and pragmas travel with the statement below them."""
    return [c for c in block.named_children if c.type != "comment" and not cp.pragma_text(c)]


def _is_barrier(parsed: cp.ParsedSource, node: Node | None) -> bool:
    return (node is not None and node.type == "expression_statement" and node.named_child_count == 1
            and node.named_children[0].type == "call_expression"
            and cp.call_name(node.named_children[0]) == "__syncthreads")


def _next_statement(node: Node) -> Node | None:
    following = node.next_named_sibling
    while following is not None and following.type == "comment":
        following = following.next_named_sibling
    return following


def _statements(parsed: cp.ParsedSource, node: Node, roles: AsyncRoles, role: str) -> list[Node]:
    """Expression statements under `node` (itself included) that carry a cp.async role."""
    return [s for s in cp.nodes_of_type(node, "expression_statement") if role in roles.of(parsed, s)]


def _strip(node: Node) -> Node:
    while node is not None and node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


def _is_minus(parsed: cp.ParsedSource, node: Node, left: str, right: str) -> bool:
    node = _strip(node)
    return (node is not None and node.type == "binary_expression"
            and parsed.text(node.child_by_field_name("operator")) == "-"
            and parsed.text(_strip(node.child_by_field_name("left"))) == left
            and parsed.text(_strip(node.child_by_field_name("right"))) == right)


def _ring_of(parsed: cp.ParsedSource, count: Node | None, constants: dict, behind: str = "2") -> tuple[str, int] | None:
    """(name, value) when a wait's pending count is `NAME - 2` (or `NAME - behind`) over a stage
    count NAME >= 2."""
    count = _strip(count) if count is not None else None
    if count is None or count.type != "binary_expression" or parsed.text(count.child_by_field_name("operator")) != "-":
        return None
    left, right = _strip(count.child_by_field_name("left")), _strip(count.child_by_field_name("right"))
    if left.type != "identifier" or parsed.text(right) != behind:
        return None
    value = constants.get(parsed.text(left))
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        return None
    return parsed.text(left), value


def _identifiers(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.nodes_of_type(node, "identifier")}


def _root_name(parsed: cp.ParsedSource, node: Node) -> str | None:
    node = _strip(node)
    while node is not None and node.type in ("subscript_expression", "field_expression", "pointer_expression",
                                             "cast_expression"):
        inner = (node.child_by_field_name("argument") or node.child_by_field_name("value")
                 or node.named_children[0])
        node = _strip(inner)
    return parsed.text(node) if node is not None and node.type == "identifier" else None


def _writable_params(parsed: cp.ParsedSource) -> dict[str, set[int]]:
    """Function name -> the indices of its parameters a call can write: non-const references."""
    found: dict[str, set[int]] = {}
    for function in cp.functions(parsed):
        declarator = function.node.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        params = declarator.child_by_field_name("parameters") if declarator is not None else None
        indices = found.setdefault(short_name(function.name), set())
        for i, param in enumerate(params.named_children if params is not None else []):
            text = parsed.text(param)
            if cp.nodes_of_type(param, "reference_declarator") and not re.search(r"\bconst\b", text):
                indices.add(i)
    return found


def _written(parsed: cp.ParsedSource, node: Node, writable: dict[str, set[int]]) -> set[str]:
    """Names a statement may write: assigned, incremented, declared, passed to a non-const
    reference parameter of a function of the file, or passed by address (`&x`) or to a macro."""
    names = set()
    for assignment in cp.nodes_of_type(node, "assignment_expression"):
        name = _root_name(parsed, assignment.child_by_field_name("left"))
        if name:
            names.add(name)
    for update in cp.nodes_of_type(node, "update_expression"):
        name = _root_name(parsed, update.child_by_field_name("argument"))
        if name:
            names.add(name)
    names |= _declared(parsed, node) if node.type == "declaration" else set()
    for declaration in cp.nodes_of_type(node, "declaration"):
        names |= _declared(parsed, declaration)
    macros = {m.name for m in cp.macros(parsed)}
    for call in cp.nodes_of_type(node, "call_expression"):
        arguments = call.child_by_field_name("arguments")
        callee = cp.call_name(call)
        for i, arg in enumerate(arguments.named_children if arguments is not None else []):
            stripped = _strip(arg)
            by_address = stripped.type == "pointer_expression" and parsed.text(stripped).startswith("&")
            if callee in macros or i in writable.get(callee, set()) or by_address:
                name = _root_name(parsed, stripped.child_by_field_name("argument") if by_address else stripped)
                if name:
                    names.add(name)
    return names


def _declared(parsed: cp.ParsedSource, node: Node) -> set[str]:
    if node.type != "declaration":
        return set()
    names = set()
    for declarator in node.children_by_field_name("declarator"):
        target = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
        while target is not None and target.type not in ("identifier", "field_identifier"):
            target = target.child_by_field_name("declarator")
        if target is not None:
            names.add(parsed.text(target))
    return names


def _check_independent(parsed: cp.ParsedSource, moved: list[Node], crossed: list[Node], where: str) -> None:
    """The refill may move across `crossed` only if neither writes what the other reads."""
    writable = _writable_params(parsed)
    moved_reads = set().union(*(_identifiers(parsed, n) for n in moved)) if moved else set()
    moved_writes = set().union(*(_written(parsed, n, writable) for n in moved)) if moved else set()
    for node in crossed:
        clash = (_written(parsed, node, writable) & moved_reads) | (moved_writes & _identifiers(parsed, node))
        if clash:
            raise NotApplicable(f"unpipeline: the refill cannot move {where} `{first_line(parsed, node)}`: "
                                f"both touch {', '.join(sorted(clash))}")


def _pure_declaration(parsed: cp.ParsedSource, node: Node) -> bool:
    return node.type == "declaration" and not cp.nodes_of_type(
        node, "call_expression", "subscript_expression", "pointer_expression", "gnu_asm_expression",
        "lambda_expression")


def _text(parsed: cp.ParsedSource, start: int, end: int, replacements: list[Edit]) -> str:
    """Source bytes [start, end) with the replacements that fall inside applied."""
    inside = [Edit(e.start - start, e.end - start, e.text) for e in replacements if start <= e.start and e.end <= end]
    return splice(parsed.data[start:end], inside)[0].decode("utf-8")


def _depth_edits(parsed: cp.ParsedSource, depth: Node, statement: Node) -> list[Edit]:
    """The wait count becomes 0; a comment after the statement keeps its column."""
    edits = [Edit(depth.start_byte, depth.end_byte, "0")]
    data = parsed.data
    rest = data[statement.end_byte:line_end(data, statement.end_byte)]
    shrink = len(parsed.text(depth)) - 1
    if shrink > 0 and rest.strip().startswith(b"//"):
        edits.append(Edit(statement.end_byte, statement.end_byte, " " * shrink))
    return edits


def _blank(data: bytes, start: int, end: int) -> bool:
    return start < end and not data[start:end].strip()


def _tidy(data: bytes, edits: list[Edit]) -> list[Edit]:
    """Join deletions that touch (where nothing is inserted between them), and let a deletion that
    leaves two blank lines together, or a blank line right after an opening brace, take one."""
    insert_at = {e.start for e in edits if e.start == e.end}
    deletions = sorted((e for e in edits if e.start < e.end and not e.text), key=lambda e: e.start)
    others = [e for e in edits if not (e.start < e.end and not e.text)]
    joined: list[Edit] = []
    for edit in deletions:
        if joined and joined[-1].end == edit.start and edit.start not in insert_at:
            joined[-1] = Edit(joined[-1].start, edit.end)
        else:
            joined.append(edit)
    tidied = []
    for edit in joined:
        before = line_start(data, max(edit.start - 1, 0))
        after = line_end(data, edit.end) if edit.end < len(data) else edit.end
        opened = data[before:edit.start].rstrip().endswith(b"{")
        if (edit.start > 0 and data[edit.start - 1:edit.start] == b"\n"
                and (_blank(data, before, edit.start) or opened)
                and _blank(data, edit.end, after) and edit.end not in insert_at and after not in insert_at):
            edit = Edit(edit.start, after)
        tidied.append(edit)
    return tidied + others


# ---------------------------------------------------------------------------------------------
# Finding the pipeline
# ---------------------------------------------------------------------------------------------


@dataclass
class Pipeline:
    function: cp.Function
    ring: str
    stages: int
    prologue: Node
    loop: Node
    wait: Node
    depth: Node
    barrier: Node
    first_wait: Node | None
    first_depth: Node | None
    shape: str  # "head": the wait opens the loop body; "step": it sits in the last step of an inner loop


def _prologue_condition(parsed: cp.ParsedSource, loop: Node, ring: str) -> Node | None:
    condition = loop.child_by_field_name("condition")
    if condition is None:
        return None
    for node in cp.nodes_of_type(condition, "binary_expression"):
        if _is_minus(parsed, node, ring, "1"):
            return node
    return None


def _main_loop(parsed: cp.ParsedSource, wait: Node, function: Node, roles: AsyncRoles) -> Node | None:
    """The loop around a wait whose block also holds, before it, a loop that copies and commits
    (the prologue); else the outermost loop around the wait."""
    outermost = None
    node = wait.parent
    while node is not None and node.id != function.id:
        if node.type in ("for_statement", "while_statement", "do_statement", "for_range_loop"):
            outermost = node
            sibling = node.prev_named_sibling
            while sibling is not None:
                if sibling.type == "for_statement" and {COPY, COMMIT} <= roles.of(parsed, sibling):
                    return node
                sibling = sibling.prev_named_sibling
        node = node.parent
    return outermost


def _pipeline_waits(parsed: cp.ParsedSource, function: cp.Function, roles: AsyncRoles,
                    constants: dict) -> list[tuple[Node, Node, tuple[str, int]]]:
    found = []
    for statement in _statements(parsed, function.node, roles, WAIT):
        count = wait_count(parsed, statement, roles)
        ring = _ring_of(parsed, count, constants)
        if ring is not None:
            found.append((statement, count, ring))
    return found


def _analyze(parsed: cp.ParsedSource, function: cp.Function, loop: Node, ring: str, roles: AsyncRoles,
             constants: dict) -> Pipeline:
    waits = _statements(parsed, loop, roles, WAIT)
    if len(waits) != 1:
        raise NotApplicable(f"unpipeline: the main loop waits {len(waits)} times per iteration; a ring pipeline "
                            "waits once")
    wait = waits[0]
    depth = wait_count(parsed, wait, roles)
    found = _ring_of(parsed, depth, constants)
    if found is None or found[0] != ring:
        raise NotApplicable(f"unpipeline: the main loop's wait `{first_line(parsed, wait)}` does not wait for "
                            f"{ring} - 2 groups")
    stages = found[1]
    barrier = _next_statement(wait)
    if not _is_barrier(parsed, barrier):
        raise NotApplicable(f"unpipeline: no __syncthreads() right after `{first_line(parsed, wait)}`")
    commits = _statements(parsed, loop, roles, COMMIT)
    if len(commits) != 1:
        raise NotApplicable(f"unpipeline: the main loop commits {len(commits)} cp.async groups per iteration; "
                            "unpipeline needs one")

    prologue = None
    sibling = loop.prev_named_sibling
    between = []
    while sibling is not None:
        if sibling.type == "for_statement" and {COPY, COMMIT} <= roles.of(parsed, sibling):
            prologue = sibling
            break
        if sibling.type != "comment" and not cp.pragma_text(sibling):
            between.insert(0, sibling)
        sibling = sibling.prev_named_sibling
    if prologue is None:
        raise NotApplicable("unpipeline: no prologue loop issuing copies and commits before the main loop")
    if _prologue_condition(parsed, prologue, ring) is None:
        raise NotApplicable(f"unpipeline: the prologue `{first_line(parsed, prologue)}` does not run {ring} - 1 times")
    first_wait = first_depth = None
    older = _commits_before(parsed, prologue, roles)
    for statement in between:
        statement_roles = roles.of(parsed, statement)
        if statement_roles & {COPY, COMMIT}:
            raise NotApplicable(f"unpipeline: `{first_line(parsed, statement)}` copies between the prologue and "
                                "the main loop")
        if WAIT in statement_roles:
            count = wait_count(parsed, statement, roles)
            # STAGES - 2: the first tile has landed; STAGES - 1: only a group older than the ring has
            if first_wait is not None or (_ring_of(parsed, count, constants) != (ring, stages) and not (
                    older and _ring_of(parsed, count, constants, "1") == (ring, stages))):
                raise NotApplicable(f"unpipeline: unexpected wait `{first_line(parsed, statement)}` before the "
                                    "main loop")
            if not _is_barrier(parsed, _next_statement(statement)):
                raise NotApplicable(f"unpipeline: no __syncthreads() right after `{first_line(parsed, statement)}`")
            first_wait, first_depth = statement, count
    others = [w for w, _, r in _pipeline_waits(parsed, function, roles, constants)
              if r[0] == ring and w.id not in (wait.id, getattr(first_wait, "id", None))]
    if others:
        raise NotApplicable(f"unpipeline: another wait on the ring, `{first_line(parsed, others[0])}`, outside "
                            "the prologue and the main loop")

    body = loop.child_by_field_name("body")
    if body is not None and wait.parent is not None and wait.parent.id == body.id:
        if _items(body)[0].id != wait.id:
            raise NotApplicable("unpipeline: the main loop's wait does not open its body")
        if first_wait is not None and _ring_of(parsed, first_depth, constants, "1") is None:
            raise NotApplicable("unpipeline: a wait for the first tile between the prologue and a main loop that "
                                "waits for it at its head")
        shape = "head"
    elif _step_loop(parsed, wait, loop) is not None:
        if first_wait is None:
            raise NotApplicable("unpipeline: the first tile is read before the main loop, but nothing waits for it")
        shape = "step"
    else:
        raise NotApplicable("unpipeline: the main loop's wait neither opens the loop body nor sits in the last step "
                            "of an inner loop over k-steps")
    return Pipeline(function, ring, stages, prologue, loop, wait, depth, barrier, first_wait, first_depth, shape)


def _commits_before(parsed: cp.ParsedSource, prologue: Node, roles: AsyncRoles) -> bool:
    """Whether a statement before the prologue, in its block, commits a group of its own (a tile
    read throughout the loop, such as attention's query tile)."""
    sibling = prologue.prev_named_sibling
    while sibling is not None:
        if COMMIT in roles.of(parsed, sibling):
            return True
        sibling = sibling.prev_named_sibling
    return False


def _step_loop(parsed: cp.ParsedSource, wait: Node, loop: Node) -> Node | None:
    """The inner loop when the wait sits in `if (ks == LAST) { ... }` directly in its body."""
    block = wait.parent
    branch = block.parent if block is not None else None
    step_block = branch.parent if branch is not None else None
    inner = step_block.parent if step_block is not None else None
    body = loop.child_by_field_name("body")
    if (block is None or block.type != "compound_statement" or branch is None or branch.type != "if_statement"
            or branch.child_by_field_name("consequence") != block or step_block is None
            or step_block.type != "compound_statement" or inner is None or inner.type != "for_statement"
            or inner.parent is None or body is None or inner.parent.id != body.id):
        return None
    return inner


# ---------------------------------------------------------------------------------------------
# The transform
# ---------------------------------------------------------------------------------------------


class Unpipeline(Transform):
    name = "unpipeline"
    intent = ("Overlap global->shared copies with compute: a ring of STAGES shared-memory stages kept STAGES - 1 "
              "tiles ahead with cp.async groups (prologue, wait_group(STAGES - 2), refill of the stage just freed).")
    removes = ("multistage_pipeline",)
    adds = ("syncthreads",)
    after = ()

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        roles = async_roles(parsed)
        constants = state.constants
        anchors = []
        for function in cp.functions(parsed):
            keys = {node.id: key for key, node in _loops_by_key(parsed, function.node)}
            seen = set()
            for wait, _, (ring, _) in _pipeline_waits(parsed, function, roles, constants):
                loop = _main_loop(parsed, wait, function.node, roles)
                if loop is None or loop.id in seen:
                    continue
                seen.add(loop.id)
                anchors.append(Anchor(short_name(function.name), "loop", f"{keys[loop.id]}:{ring}",
                                      first_line(parsed, wait)))
        return anchors

    def _site(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[cp.Function, Node, str]:
        match = _KEY.match(anchor.key) if anchor.kind == "loop" else None
        if match is None:
            raise NotApplicable(f"unpipeline needs a loop anchor keyed `<index>#<n>:<STAGES>`, not {anchor}")
        for function in cp.functions(parsed):
            if short_name(function.name) != anchor.function:
                continue
            for key, node in _loops_by_key(parsed, function.node):
                if key == f"{match['var']}#{match['n']}":
                    return function, node, match["ring"]
        raise NotApplicable(f"unpipeline: no loop over '{match['var']}' number {match['n']} in {anchor.function}")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        roles = async_roles(parsed)
        constants = state.constants
        function, loop, ring = self._site(parsed, anchor)
        pipe = _analyze(parsed, function, loop, ring, roles, constants)
        edits = _depth_edits(parsed, pipe.depth, pipe.wait) if pipe.shape == "step" else []
        if pipe.shape == "head":
            edits += self._head(parsed, pipe, roles)
        else:
            edits += self._step(parsed, pipe, roles, constants)
        ring_edit = self._ring_constant(parsed, pipe)
        one_stage = parse_constants(splice(parsed.data, [ring_edit])[0].decode("utf-8"))
        assert_edits, needs = self._static_asserts(parsed, pipe, constants, one_stage)
        source = splice(parsed.data, _tidy(parsed.data, edits + [ring_edit] + assert_edits))[0].decode("utf-8")
        plan = self._plan(state, pipe, constants, one_stage, needs)
        note = (f"{pipe.ring} {pipe.stages} -> 1: " + ("each tile is copied at the head of its iteration, waited for "
                                                       "(wait_group 0) and fenced by barriers"
                                                       if pipe.shape == "head" else
                                                       "the next tile is copied at the last k-step, behind a barrier, "
                                                       "and waited for (wait_group 0) before its first fragments"))
        return self.rewrite(state, anchor, Direction.BACKWARD, source, plan=plan,
                            carrier={pipe.ring: pipe.stages}, note=note)

    # -- the loop that waits at its head ---------------------------------------------------------

    def _head(self, parsed: cp.ParsedSource, pipe: Pipeline, roles: AsyncRoles) -> list[Edit]:
        data = parsed.data
        body = pipe.loop.child_by_field_name("body")
        items = _items(body)
        if len(items) < 3 or items[1].id != pipe.barrier.id:
            raise NotApplicable("unpipeline: the main loop's body is not wait, barrier, then its work")
        refill = [i for i, item in enumerate(items) if roles.of(parsed, item) & {COPY, COMMIT}]
        if not refill or refill != list(range(refill[0], refill[-1] + 1)) or refill[0] < 2:
            raise NotApplicable("unpipeline: the main loop's copies and commit are not one run of statements")
        if COMMIT not in roles.of(parsed, items[refill[-1]]):
            raise NotApplicable("unpipeline: the main loop's refill does not end with its commit")
        moved = [items[i] for i in refill]
        reads = set().union(*(_identifiers(parsed, n) for n in moved))
        insert_after = 1
        for i in range(2, refill[0]):
            if _declared(parsed, items[i]) & reads:
                insert_after = i
        for item in items[2:insert_after + 1]:
            if not _pure_declaration(parsed, item):
                raise NotApplicable(f"unpipeline: `{first_line(parsed, item)}` would run before the wait but may "
                                    "read memory")
        _check_independent(parsed, moved, items[insert_after + 1:refill[0]], "above")

        wait_start, _ = item_span(parsed, pipe.wait)
        _, barrier_end = item_span(parsed, pipe.barrier)
        refill_start, _ = item_span(parsed, moved[0])
        _, refill_end = item_span(parsed, moved[-1])
        prologue_start, prologue_end = item_span(parsed, pipe.prologue)
        at = barrier_end if insert_after == 1 else item_span(parsed, items[insert_after])[1]
        waited = _text(parsed, wait_start, barrier_end, _depth_edits(parsed, pipe.depth, pipe.wait))
        closing = body.children[-1]
        if data[line_start(data, closing.start_byte):closing.start_byte].strip():
            raise NotApplicable("unpipeline: the main loop's closing brace shares its line with code")
        indent = indentation(data, pipe.wait.start_byte)
        older = _depth_edits(parsed, pipe.first_depth, pipe.first_wait) if pipe.first_wait is not None else []
        return older + [
            Edit(prologue_start, prologue_end),
            Edit(wait_start, barrier_end),
            Edit(at, at, _text(parsed, refill_start, refill_end, []) + waited),
            Edit(refill_start, refill_end),
            Edit(line_start(data, closing.start_byte), line_start(data, closing.start_byte),
                 f"{indent}__syncthreads();  // {_BARRIER_NOTE}\n"),
        ]

    # -- the loop that waits in its last k-step ----------------------------------------------------

    def _step(self, parsed: cp.ParsedSource, pipe: Pipeline, roles: AsyncRoles, constants: dict) -> list[Edit]:
        data = parsed.data
        inner = _step_loop(parsed, pipe.wait, pipe.loop)
        step = loop_variable(parsed, inner)
        steps = self._trip_count(parsed, inner, step, constants)
        branch = pipe.wait.parent.parent
        if self._step_of(parsed, branch, step, constants) != steps - 1 or branch.child_by_field_name("alternative"):
            raise NotApplicable(f"unpipeline: the wait is not in the last step `if ({step} == {steps - 1})` alone")
        body = pipe.loop.child_by_field_name("body")
        for item in _items(body):
            if item.id != inner.id and roles.of(parsed, item) & {COPY, COMMIT, WAIT}:
                raise NotApplicable(f"unpipeline: `{first_line(parsed, item)}` copies or waits outside the k-step loop")
        items = _items(inner.child_by_field_name("body"))
        refill = [item for item in items if item.id != branch.id and roles.of(parsed, item) & {COPY, COMMIT}]
        if not refill or any(roles.of(parsed, item) & {WAIT} for item in refill):
            raise NotApplicable("unpipeline: no refill in the k-step loop apart from the wait")
        for item in refill:
            at_step = self._step_of(parsed, item, step, constants)
            if at_step is None or at_step >= steps - 1 or item.child_by_field_name("alternative") is not None:
                raise NotApplicable(f"unpipeline: the refill statement `{first_line(parsed, item)}` is not an "
                                    f"`if ({step} == c)` block of an earlier k-step")
        reads = set().union(*(_identifiers(parsed, n) for n in refill))
        first = min(items.index(item) for item in refill)
        dependencies = [item for item in items[:first] if _declared(parsed, item) & reads]
        moved_ids = {n.id for n in refill + dependencies}
        rest = [item for item in items if item.id not in moved_ids and item.id != branch.id]
        for item in dependencies:
            used = set().union(*(_identifiers(parsed, n) for n in rest)) if rest else set()
            if _declared(parsed, item) & used:
                raise NotApplicable(f"unpipeline: `{first_line(parsed, item)}` is used outside the refill")
        crossed = rest + [n for n in _items(branch.child_by_field_name("consequence"))]
        _check_independent(parsed, refill + dependencies, crossed, "past")

        lookahead = self._lookahead_edits(parsed, refill + dependencies, pipe.ring)
        indent = indentation(data, pipe.wait.start_byte)
        pieces = [f"{indent}__syncthreads();  // {_BARRIER_NOTE}\n"]
        edits = []
        for item in sorted(refill + dependencies, key=lambda n: n.start_byte):
            start, end = item_span(parsed, item)
            edits.append(Edit(start, end))
            if item.type == "if_statement":
                above = _text(parsed, start, line_start(data, item.start_byte), lookahead)
                pieces.append(reindent(above, len(indentation(data, item.start_byte)), indent))
                pieces.append(self._unwrapped(parsed, item, lookahead, indent))
            else:
                column = len(indentation(data, item.start_byte))
                pieces.append(reindent(_text(parsed, start, end, lookahead), column, indent))
        at = leading_start(parsed, pipe.wait)
        edits.append(Edit(at, at, "".join(pieces)))
        edits += _depth_edits(parsed, pipe.first_depth, pipe.first_wait)
        condition = _prologue_condition(parsed, pipe.prologue, pipe.ring)
        edits.append(Edit(condition.start_byte, condition.end_byte, "1"))
        return edits

    def _trip_count(self, parsed: cp.ParsedSource, loop: Node, var: str, constants: dict) -> int:
        init = loop.child_by_field_name("initializer")
        condition = _strip(loop.child_by_field_name("condition"))
        update = loop.child_by_field_name("update")
        start = init.child_by_field_name("declarator") if init is not None and init.type == "declaration" else None
        start_value = start.child_by_field_name("value") if start is not None else None
        if (start_value is None or parsed.text(start_value) != "0" or condition is None
                or condition.type != "binary_expression"
                or parsed.text(condition.child_by_field_name("operator")) != "<"
                or parsed.text(condition.child_by_field_name("left")) != var or update is None
                or parsed.text(update).replace(" ", "") not in (f"++{var}", f"{var}++", f"{var}+=1")):
            raise NotApplicable(f"unpipeline: the k-step loop is not `for (int {var} = 0; {var} < N; ++{var})`")
        steps = c_value(parsed.text(condition.child_by_field_name("right")), constants)
        if steps is None or steps < 2:
            raise NotApplicable(f"unpipeline: the k-step loop's trip count `{parsed.text(condition)}` is not a "
                                "constant of at least 2")
        return steps

    def _step_of(self, parsed: cp.ParsedSource, node: Node, var: str, constants: dict) -> int | None:
        """c for `if (var == c) ...`, else None."""
        if node.type != "if_statement":
            return None
        condition = node.child_by_field_name("condition")
        value = condition.child_by_field_name("value") if condition is not None else None
        value = _strip(value) if value is not None else None
        if (value is None or value.type != "binary_expression"
                or parsed.text(value.child_by_field_name("operator")) != "=="
                or parsed.text(_strip(value.child_by_field_name("left"))) != var):
            return None
        return c_value(parsed.text(value.child_by_field_name("right")), constants)

    def _lookahead_edits(self, parsed: cp.ParsedSource, nodes: list[Node], ring: str) -> list[Edit]:
        """`RING - 1` -> `1` and `a + RING - 1` -> `a + 1`: the refill now fetches one tile ahead."""
        edits = []
        for node in nodes:
            for minus in cp.nodes_of_type(node, "binary_expression"):
                if parsed.text(minus.child_by_field_name("operator")) != "-" or parsed.text(
                        _strip(minus.child_by_field_name("right"))) != "1":
                    continue
                left = _strip(minus.child_by_field_name("left"))
                if left.type == "identifier" and parsed.text(left) == ring:
                    edits.append(Edit(minus.start_byte, minus.end_byte, "1"))
                elif (left.type == "binary_expression" and parsed.text(left.child_by_field_name("operator")) == "+"
                      and parsed.text(_strip(left.child_by_field_name("right"))) == ring):
                    edits.append(Edit(minus.start_byte, minus.end_byte,
                                      f"{parsed.text(left.child_by_field_name('left'))} + 1"))
        return edits

    def _unwrapped(self, parsed: cp.ParsedSource, branch: Node, lookahead: list[Edit], indent: str) -> str:
        """The statements of an `if (ks == c)` block, at `indent`."""
        data = parsed.data
        consequence = branch.child_by_field_name("consequence")
        if consequence.type == "compound_statement":
            inner = [c for c in consequence.named_children]
            if not inner:
                return ""
            start = leading_start(parsed, inner[0]) if own_lines(parsed, inner[0]) else None
            last = own_lines(parsed, inner[-1])
            closing = consequence.children[-1]
            if start is None or last is None or data[line_start(data, closing.start_byte):closing.start_byte].strip():
                raise NotApplicable(f"unpipeline: the block of `{first_line(parsed, branch)}` is not laid out one "
                                    "statement per line")
            column = len(indentation(data, inner[0].start_byte))
            return reindent(_text(parsed, start, last[1], lookahead), column, indent)
        end = line_end(data, branch.end_byte - 1)
        column = parsed.column(consequence) - 1
        text = " " * column + _text(parsed, consequence.start_byte, end, lookahead)
        return reindent(text, column, indent)

    # -- what STAGES = 1 changes elsewhere -------------------------------------------------------

    def _ring_constant(self, parsed: cp.ParsedSource, pipe: Pipeline) -> Edit:
        for declaration in cp.declarations(parsed):
            if declaration.name == pipe.ring and declaration.function is None:
                if declaration.init is None or declaration.init.type != "number_literal":
                    raise NotApplicable(f"unpipeline: {pipe.ring} is not defined as a plain number")
                return Edit(declaration.init.start_byte, declaration.init.end_byte, "1")
        for macro in cp.macros(parsed):
            value = macro.node.child_by_field_name("value")
            if macro.name == pipe.ring and macro.params is None and value is not None and re.fullmatch(
                    r"\d+", parsed.text(value).strip()):
                text = parsed.text(value)
                offset = value.start_byte + len(text) - len(text.lstrip())
                return Edit(offset, offset + len(text.strip()), "1")
        raise NotApplicable(f"unpipeline: no namespace-scope definition of {pipe.ring}")

    def _static_asserts(self, parsed: cp.ParsedSource, pipe: Pipeline, before: dict,
                        after: dict) -> tuple[list[Edit], list[str]]:
        changed = {name for name in before if before.get(name) != after.get(name)} | {pipe.ring}
        edits, needs = [], []
        for node in cp.nodes_of_type(parsed.root, "static_assert_declaration"):
            condition = _strip(node.named_children[0])
            if not _identifiers(parsed, condition) & changed:
                continue
            value = c_value(parsed.text(condition), after)
            if value is None:
                raise NotApplicable(f"unpipeline: cannot check `{first_line(parsed, node)}` with one stage")
            if value:
                continue
            operator = parsed.text(condition.child_by_field_name("operator")) if condition.type == "binary_expression" \
                else ""
            left = _strip(condition.child_by_field_name("left")) if operator else None
            right = _strip(condition.child_by_field_name("right")) if operator else None
            span = own_lines(parsed, node) or (node.start_byte, node.end_byte)
            if operator in (">=", ">", "<=", "<") and {parsed.text(left), parsed.text(right)} & {pipe.ring} and (
                    left.type == "number_literal" or right.type == "number_literal"):
                edits.append(Edit(*span))  # "a pipeline needs at least two stages"
                continue
            small, large = (left, right) if operator in ("<=", "<") else (right, left)
            if operator in ("<=", ">=") and not _identifiers(parsed, small) & changed and \
                    _identifiers(parsed, large) & changed:
                needs.append(parsed.text(small))  # another user of the ring's memory (an epilogue tile)
                edits.append(Edit(*span))
                continue
            raise NotApplicable(f"unpipeline: `{first_line(parsed, node)}` fails with one stage")
        return edits, needs

    def _plan(self, state: KernelState, pipe: Pipeline, before: dict, after: dict, needs: list[str]):
        changed = {name for name in before if before.get(name) != after.get(name)} | {pipe.ring}
        sizes = []
        for need in needs:
            value = c_value(need, after)
            if value is None:
                raise NotApplicable(f"unpipeline: cannot size `{need}`")
            sizes.append(need.strip() if _SIZE_TEXT.match(need) and "/" not in need else str(value))
        launches, grown = [], False
        for launch in state.plan.launches:
            shared = launch.shared
            try:
                depends = isinstance(shared, str) and bool(expr.names(shared) & changed)
            except ExpressionError:
                depends = False
            if depends and sizes:
                shared = f"max({shared}, {', '.join(sizes)})"
                grown = True
            launches.append(replace(launch, shared=shared))
        if sizes and not grown:
            raise NotApplicable(f"unpipeline: {', '.join(needs)} must fit in shared memory, but no launch sizes its "
                                f"dynamic shared memory from {pipe.ring}")
        return with_plan(state, launches=tuple(launches))


register(Unpipeline())
