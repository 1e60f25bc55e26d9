"""The register cache as hand-written kernels spell it, for `uncache_row`: a per-thread array filled once and
read again in later passes.

    Vec cache[CACHED];
    #pragma unroll
    for (int i = 0; i < CACHED; ++i) {            // the filling pass
        const int j = i * THREADS + tid;
        if (j < n) { cache[i] = __ldg(xv + j); m = fmaxf(m, vec_max(cache[i])); }
    }
    ...
    #pragma unroll
    for (int i = 0; i < CACHED; ++i) {            // a later pass: reads the registers
        const int j = i * THREADS + tid;
        if (j < n) yv[j] = vec_normalise(cache[i], m2, inv_sum);
    }

Uncaching (backward) makes every later pass load again: each `cache[i]` there becomes the filling pass's
loaded expression, `(__ldg(xv + j))`. The array and the filling pass stay as they are (the compiler keeps
what is written and read in one iteration in a register), so the forward is exact: in the later passes,
each `(E)` becomes `cache[i]` again.

Match, conservative: the array is declared `TYPE NAME[SIZE];` with no initializer; every use of it is
`NAME[I]` inside a loop `for (int I = 0; I < SIZE; ++I)` (one index name for all of them); the first such
loop stores it once, `NAME[I] = E;`, reads it too (else the array only batches loads ahead of
their one use, another mechanism), and no later one writes it; E assigns nothing; every name E uses that
the filling pass declares is declared by the same statement in each later pass, and no name E depends on
(directly or through those declarations) is assigned from the filling pass to the last later one, the index
aside (so E means the same in every pass); and no
later pass holds the text `(E)` already (the forward finds it there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._naive import squash
from klineage.transforms.base import NotApplicable

_ARRAY = re.compile(r"^([\w:<>]+) (\w+)\[(\w+)\];$")
_LOOP = r"^for \(int (\w+) = 0; \1 < {size}; (?:\+\+\1|\1\+\+)\)"
_WRITES = re.compile(r"(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--")


@dataclass(frozen=True)
class RegisterCache:
    """One register array of a function: its declaration, filling pass, loaded expression and later passes."""

    name: str
    declaration: Node
    index: str
    store: Node  # the `NAME[I] = E` assignment in the filling pass
    loaded: str  # E, verbatim
    later: tuple[Node, ...]  # the later passes (for statements), in source order

    @property
    def reload(self) -> str:
        return f"({self.loaded})"


def arrays(parsed: cp.ParsedSource, body: Node) -> list[tuple[str, str, Node]]:
    """(name, size, declaration) of every `TYPE NAME[SIZE];` declared in the body."""
    found = []
    for node in cp.nodes_of_type(body, "declaration"):
        match = _ARRAY.match(squash(parsed.text(node)))
        if match:
            found.append((match[2], match[3], node))
    return found


def _passes(parsed: cp.ParsedSource, body: Node, size: str) -> list[tuple[Node, str]]:
    """(loop, index) of every `for (int I = 0; I < SIZE; ++I)` in the body, in source order."""
    header = re.compile(_LOOP.format(size=re.escape(size)))
    found = []
    for node in cp.nodes_of_type(body, "for_statement"):
        text = squash(parsed.data[node.start_byte:node.child_by_field_name("body").start_byte].decode())
        match = header.match(text)
        if match:
            found.append((node, match[1]))
    return sorted(found, key=lambda pair: pair[0].start_byte)


def _inside(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def _identifiers(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.nodes_of_type(node, "identifier")}


def _declared_in(parsed: cp.ParsedSource, scope: Node, before: int) -> dict[str, str]:
    """name -> the squashed declaration statement, for the declarations in `scope` that end before `before`."""
    declared = {}
    for node in cp.nodes_of_type(scope, "declaration"):
        if node.end_byte <= before:
            for declarator in node.children_by_field_name("declarator"):
                while declarator.child_by_field_name("declarator") is not None:  # `j = ...`, `v[4]`: the name
                    declarator = declarator.child_by_field_name("declarator")
                declared.setdefault(parsed.text(declarator), squash(parsed.text(node)))
    return declared


def _assigned(parsed: cp.ParsedSource, body: Node, name: str, span: tuple[int, int]) -> bool:
    """Whether a statement of the body within the byte span assigns `name` or changes it by ++/--."""
    for change in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = change.child_by_field_name("left") or change.child_by_field_name("argument")
        # `red[tid / 32] = m` changes memory, not tid: only the name itself as the target counts
        if target is not None and span[0] <= change.start_byte < span[1] \
                and squash(parsed.text(target)).strip("()") == name:
            return True
    return False


def register_cache(parsed: cp.ParsedSource, body: Node, name: str, size: str, declaration: Node) -> RegisterCache:
    """The array's register cache, or NotApplicable saying why it is none."""
    passes = [(loop, index) for loop, index in _passes(parsed, body, size)
              if re.search(rf"\b{name}\b", parsed.text(loop.child_by_field_name("body")))]
    if len(passes) < 2:
        raise NotApplicable(f"{name} is read in fewer than two passes over {size}")
    if len({index for _, index in passes}) != 1:
        raise NotApplicable(f"the passes over {name} use different index names")
    index = passes[0][1]
    uses = [n for n in cp.nodes_of_type(body, "identifier") if parsed.text(n) == name and n != _declared(declaration)]
    subscripts = [n for loop, _ in passes for n in cp.nodes_of_type(loop, "subscript_expression")
                  if parsed.text(n.child_by_field_name("argument")) == name
                  and squash(parsed.text(n.child_by_field_name("indices"))) in (f"[{index}]", index)]
    if len(uses) != len(subscripts):
        raise NotApplicable(f"{name} is used other than as {name}[{index}] inside its passes")
    writes = [n for n in cp.nodes_of_type(body, "assignment_expression", "update_expression")
              if any(_inside(s, n.child_by_field_name("left") or n.child_by_field_name("argument") or n)
                     for s in subscripts)]
    first = passes[0][0]
    if len(writes) != 1 or not _inside(writes[0], first) or writes[0].type != "assignment_expression" \
            or parsed.text(writes[0].child_by_field_name("operator")) != "=":
        raise NotApplicable(f"{name} is not stored exactly once, by `=`, in its first pass")
    store = writes[0]
    if sum(_inside(n, first) for n in subscripts) < 2:
        # read by one pass only: loads batched ahead of their use (memory-level parallelism), not a row kept
        # in registers across passes
        raise NotApplicable(f"the pass that fills {name} does not read it: it is consumed once")
    loaded = parsed.text(store.child_by_field_name("right"))
    if _WRITES.search(re.sub(r"[<>!=]=", "", loaded)):
        raise NotApplicable(f"the value stored in {name} assigns something")
    local = _declared_in(parsed, first, store.start_byte)
    later = tuple(loop for loop, _ in passes[1:])
    span = (first.start_byte, later[-1].end_byte)  # from the filling pass to the last reading one
    needed = set()  # the names E depends on, through the pass's own declarations too
    for used in sorted(_identifiers(parsed, store.child_by_field_name("right"))):
        if used in local:
            if any(local[used] not in _declared_in(parsed, loop, loop.end_byte).values() for loop in later):
                raise NotApplicable(f"'{used}' of the stored value is not declared alike in every later pass")
            needed |= set(re.findall(r"\b[A-Za-z_]\w*\b", local[used].split("=", 1)[-1]))
        else:
            needed.add(used)
    for used in sorted(needed - {index}):
        if _assigned(parsed, body, used, span):
            raise NotApplicable(f"'{used}', which the stored value depends on, changes between the passes")
    reload = f"({loaded})"
    if any(reload in parsed.text(loop) for loop in later):
        raise NotApplicable(f"a later pass already reads {reload}")
    return RegisterCache(name, declaration, index, store, loaded, later)


def _declared(declaration: Node) -> Node | None:
    """The declared name's identifier node of `TYPE NAME[SIZE];`."""
    declarator = declaration.child_by_field_name("declarator")
    return declarator.child_by_field_name("declarator") if declarator is not None else None


def caches(parsed: cp.ParsedSource, body: Node) -> list[RegisterCache]:
    """Every register cache of the function body."""
    found = []
    for name, size, declaration in arrays(parsed, body):
        try:
            found.append(register_cache(parsed, body, name, size, declaration))
        except NotApplicable:
            continue
    return found


def named(parsed: cp.ParsedSource, body: Node, name: str) -> RegisterCache:
    """The register cache of the array `name`, or NotApplicable saying why there is none."""
    for array, size, declaration in arrays(parsed, body):
        if array == name:
            return register_cache(parsed, body, name, size, declaration)
    raise NotApplicable(f"no array {name}")


def uncache_edits(parsed: cp.ParsedSource, cache: RegisterCache) -> list[tuple[int, int, str]]:
    """Backward: every `NAME[I]` of the later passes becomes the reloaded expression."""
    return [(node.start_byte, node.end_byte, cache.reload) for loop in cache.later
            for node in cp.nodes_of_type(loop, "subscript_expression")
            if parsed.text(node.child_by_field_name("argument")) == cache.name]


def recache_edits(parsed: cp.ParsedSource, body: Node, name: str) -> list[tuple[int, int, str]]:
    """Forward, on what backward left: in the passes over the array's size after its filling pass, each
    reloaded expression `(E)` becomes `NAME[I]` again. NotApplicable where there is none."""
    size = next((size for array, size, _ in arrays(parsed, body) if array == name), None)
    if size is None:
        raise NotApplicable(f"no array {name}")
    passes = _passes(parsed, body, size)
    stores = [(loop, index, node) for loop, index in passes for node in cp.nodes_of_type(loop, "assignment_expression")
              if squash(parsed.text(node.child_by_field_name("left"))) == f"{name}[{index}]"]
    if len(stores) != 1:
        raise NotApplicable(f"{name} is not stored once in a pass over {size}")
    first, index, store = stores[0]
    reload = f"({parsed.text(store.child_by_field_name('right'))})"
    edits = []
    for loop, _ in [(loop, i) for loop, i in passes if loop.start_byte > first.end_byte and i == index]:
        text, at = parsed.text(loop), 0
        while (found := text.find(reload, at)) >= 0:
            start = loop.start_byte + len(text[:found].encode())
            edits.append((start, start + len(reload.encode()), f"{name}[{index}]"))
            at = found + len(reload)
    if not edits:
        raise NotApplicable(f"no later pass reloads {reload}")
    return edits
