"""scalarize_row_cache: a warp's register row cache, filled and written 16 bytes a lane at a time, goes back to one
float a lane per 32 columns.

The mechanism (forward): on `uncache_row`'s canonical cache (`float row_cache[N];`, each pass over the row an
`if (n <= 32 * N)` walking `cache_t` with `j = lane + 32 * cache_t`, its uncached form in the `else`), each lane
takes four consecutive columns per step instead: `cache_j4 = 4 * (lane + 32 * cache_q)`, the row's float
`4 * cache_q + cache_k` of the lane's cache holding column `cache_j4 + cache_k`. Every row array a pass reads at
`[j]` or `[X + j]` is loaded once per step as a `float4` (through the read-only cache, `__ldg`, where the pass
read it so, or the kernel cannot write it: a `const float*` parameter or a local started at one, no `const_cast`,
no buffer passed twice), the
pass's statements run once per column on registers, and every array it writes at `[X + j]` is stored once per
step as a `float4`. That layout is taken only where it is exact and aligned, decided once before the first pass
(`row_vec4`): n divisible by 4, the row fitting, every vectorized pointer 16-byte aligned and every offset X a
multiple of 4 (an X with n as a factor is one already). Otherwise the passes run as they were, kept verbatim
after `else`: the cache one float a lane per 32 columns, or no cache at all.

Backward drops the `row_vec4` flag and each pass's `if (row_vec4) {...} else` in front of the pass as it was.

Legality (forward_sites), conservative: every pass over the cache has the canonical shape; in each, an array
other than the cache is subscripted with the column `j` only as `[j]` or `[X + j]`, with X free of `j`; it is a
float pointer the kernel never moves, declared (a parameter, or a local before the cache) where the flag is
computed, as are the names of X, none of which the kernel assigns; an array written in a pass is written there
once, by `=`, in a statement no condition or loop encloses within the pass, and not read in it (its four values
are stored after the four columns ran); a pass has no barrier, shuffle, atomic, `return`, `break`, `continue`
or `goto`, and assigns neither `j` nor `cache_t`; the kernel names none of the names the forward declares; the
launch passes no buffer twice.

Anchor: the kernel, kind "function", key "row_cache".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms._edit import (
    Edit,
    indentation,
    is_written,
    ldg_calls,
    outer_parens,
    own_lines,
    params,
    reindent,
    splice,
)
from klineage.transforms._naive import kernel, launches_of, parameters, squash
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

WIDTH = 4
FLAG = "row_vec4"
KEY = "row_cache"
_OWN_NAMES = re.compile(rf"\b(?:{FLAG}|cache_q|cache_k|cache_j4|cache_r\d+|cache_v\d+)\b")
_CACHE = re.compile(r"^float row_cache\[(\d+)\];$")
_FIT = re.compile(r"^\((\w+) <= 32 \* (\d+)\)$")
_COLUMN = re.compile(r"^const int (\w+) = (\w+) \+ 32 \* cache_t;$")
_FORBIDDEN = re.compile(r"\b(?:__shfl\w*|__sync\w*|atomic\w*|return|break|continue|goto|asm)\b")
_OFFSET = re.compile(r"^[\w\s()*+\-]+$")  # names, numbers, casts and integer arithmetic
_FLOAT_POINTER = re.compile(r"\bfloat\s*\*\s*(?:const\s+)?(?:__restrict__\s+)?(\w+)")


@dataclass(frozen=True)
class Access:
    """One use of a row array in a pass: `node` is what the forward replaces (the subscript, or the whole
    `__ldg(&a[...])` around it), `group` the vector it belongs to (array and offset)."""

    node: Node
    array: str
    offset: str  # X of `a[X + j]`, "" for `a[j]`
    written: bool
    through_ldg: bool

    @property
    def group(self) -> tuple[str, str]:
        return self.array, self.offset


@dataclass(frozen=True)
class CachePass:
    node: Node  # the `if (n <= 32 * N)` statement
    bound: str  # n
    column: str  # j
    lane: str
    block: Node  # the statements under `if (j < n)`
    accesses: tuple[Access, ...]


@dataclass(frozen=True)
class Site:
    function: cp.Function
    declaration: Node  # float row_cache[N];
    size: int
    bound: str
    passes: tuple[CachePass, ...]
    pointers: tuple[str, ...]  # every vectorized array, in order of first use
    offsets: tuple[str, ...]  # the offsets the flag checks (those without the bound as a factor)
    read_only: frozenset[str]  # the arrays no thread of the launch writes: loaded through the read-only cache


class ScalarizeRowCache(Transform):
    name = "scalarize_row_cache"
    intent = ("Fill and write a warp's register row cache 16 bytes a lane at a time (four consecutive columns per "
              "lane per step, float4 loads and stores of every row array) where the row length divides by 4 and the "
              "pointers are 16-byte aligned, the cache as it was otherwise.")
    removes = ("vector_type_float4",)
    placement = Placement.ANALYSIS

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        return [Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])
                for function in cp.functions(parsed) if function.is_kernel and _flag(parsed, function) is not None]

    def forward_sites(self, state: KernelState, carrier: Mapping[str, Any] | None = None) -> list[Anchor]:
        parsed = cp.parse(state.source)
        anchors = []
        for function in cp.functions(parsed):
            if not function.is_kernel:
                continue
            try:
                _site(state, parsed, function)
            except NotApplicable:
                continue
            anchors.append(Anchor(function.name, "function", KEY, parsed.text(function.node)[:200]))
        return anchors

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site = _site(state, parsed, kernel(parsed, anchor))
        data = parsed.data
        indent = indentation(data, site.declaration.start_byte)
        flag = _flag_text(site)
        edits = [Edit(site.declaration.end_byte, site.declaration.end_byte, f"\n{indent}{flag}")]
        edits += [Edit(step.node.start_byte, step.node.start_byte, _vector_pass(parsed, site, step))
                  for step in site.passes]
        source = splice(data, edits)[0].decode("utf-8")
        moved = ", ".join(site.pointers)
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"width": WIDTH},
                            note=f"{site.function.name}: row cache filled and written as float4 ({moved}) when "
                                 f"{site.bound} % {WIDTH} == 0 and the pointers are 16-byte aligned")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        function = kernel(parsed, anchor)
        flag = _flag(parsed, function)
        if flag is None:
            raise NotApplicable(f"{anchor}: no {FLAG} flag")
        span = own_lines(parsed, flag)
        if span is None:
            raise NotApplicable(f"{anchor}: the {FLAG} flag shares its line")
        edits = [Edit(*span)]
        for node in cp.nodes_of_type(function.node, "if_statement"):
            if squash(parsed.text(node.child_by_field_name("condition"))) != f"({FLAG})":
                continue
            alternative = node.child_by_field_name("alternative")
            kept = alternative.named_children[-1] if alternative is not None and alternative.named_children else None
            if kept is None or kept.type != "if_statement":
                raise NotApplicable(f"{anchor}: a {FLAG} branch without the pass it stands in front of")
            edits.append(Edit(node.start_byte, kept.start_byte, ""))
        if len(edits) < 2:
            raise NotApplicable(f"{anchor}: no pass takes the {FLAG} branch")
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            note=f"{function.name}: the row cache filled and written one float a lane per 32 columns")


def _flag(parsed: cp.ParsedSource, function: cp.Function) -> Node | None:
    body = function.node.child_by_field_name("body")
    return next((node for node in (body.named_children if body is not None else ()) if node.type == "declaration"
                 and squash(parsed.text(node)).startswith(f"const bool {FLAG} =")), None)


def _site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> Site:
    """The kernel's row cache and its passes, or NotApplicable saying why the forward may not vectorize them."""
    body = function.node.child_by_field_name("body")
    declaration = next((node for node in (body.named_children if body is not None else ())
                        if node.type == "declaration" and _CACHE.match(squash(parsed.text(node)))), None)
    if declaration is None:
        raise NotApplicable(f"{function.name} keeps no canonical row_cache")
    if _OWN_NAMES.search(parsed.text(function.node)):
        raise NotApplicable(f"{function.name} already names {FLAG} or one of the cache_ names the forward declares")
    size = int(_CACHE.match(squash(parsed.text(declaration)))[1])
    if size % WIDTH:
        raise NotApplicable(f"the cache's {size} floats a lane are no multiple of {WIDTH}")
    launches_of(state, function.name, dimensions=3)  # distinct buffers: a stored vector reaches no read row
    passes = [_pass(parsed, node, size) for node in cp.nodes_of_type(body, "if_statement")
              if _FIT.match(squash(parsed.text(node.child_by_field_name("condition"))))]
    if not passes:
        raise NotApplicable(f"{function.name} has no pass over its row_cache")
    bounds = {step.bound for step in passes}
    if len(bounds) != 1:
        raise NotApplicable("the passes over the cache have different bounds")
    bound = bounds.pop()
    available = _available(parsed, function, body, declaration.start_byte)
    pointers, offsets = [], []
    floats = set(_FLOAT_POINTER.findall(parsed.text(function.node)))
    for step in passes:
        for access in step.accesses:
            if access.array not in floats:
                raise NotApplicable(f"{access.array} is no float pointer")
            if access.array not in available:
                raise NotApplicable(f"{access.array} is not declared, unchanged, before the cache")
            unknown = set(re.findall(r"\b[A-Za-z_]\w*\b", access.offset)) - available - {"long", "int", "unsigned"}
            if unknown:
                raise NotApplicable(f"the offset {access.offset} of {access.array} uses {sorted(unknown)[0]}, which "
                                    f"is not fixed before the cache")
            if access.array not in pointers:
                pointers.append(access.array)
            if access.offset and bound not in _factors(access.offset) and access.offset not in offsets:
                offsets.append(access.offset)
    return Site(function, declaration, size, bound, tuple(passes), tuple(pointers), tuple(offsets),
                _read_only(parsed, function, body))


def _read_only(parsed: cp.ParsedSource, function: cp.Function, body: Node) -> frozenset[str]:
    """The `const float*` parameters, and the `const float*` locals the body starts at one of them, of a kernel
    without `const_cast` (whose launch passes no buffer twice): memory nothing in the launch writes."""
    if "const_cast" in parsed.text(function.node):
        return frozenset()
    constant = {param.name for param in params(parsed, function.node)
                if param.indirection == "*" and re.match(r"const float\b", squash(parsed.text(param.node)))}
    for node in body.named_children:
        local = re.match(r"^const float\s*\*\s*(?:__restrict__\s+)?(\w+) = \(?(\w+)\b", squash(parsed.text(node)))
        if node.type == "declaration" and local and local[2] in constant:
            constant.add(local[1])
    return frozenset(constant)


def _pass(parsed: cp.ParsedSource, node: Node, size: int) -> CachePass:
    """One pass of the canonical cache, `if (n <= 32 * N) { for cache_t { j = ...; if (j < n) {...} } } else`."""
    bound, fits = _FIT.match(squash(parsed.text(node.child_by_field_name("condition")))).groups()
    consequence, alternative = node.child_by_field_name("consequence"), node.child_by_field_name("alternative")
    loops = [c for c in consequence.named_children if c.type == "for_statement"] if consequence else []
    if int(fits) != size or alternative is None or len(loops) != 1:
        raise NotApplicable(f"`{squash(parsed.text(node))[:60]}` is not a pass of the canonical row cache")
    loop = loops[0]
    header = squash(parsed.data[loop.start_byte:loop.child_by_field_name("body").start_byte].decode())
    statements = loop.child_by_field_name("body").named_children
    column = _COLUMN.match(squash(parsed.text(statements[0]))) if len(statements) == 2 else None
    inner = statements[1] if column else None
    if header != f"for (int cache_t = 0; cache_t < {size}; ++cache_t)" or column is None \
            or inner.type != "if_statement" or inner.child_by_field_name("alternative") is not None \
            or squash(parsed.text(inner.child_by_field_name("condition"))) != f"({column[1]} < {bound})" \
            or inner.child_by_field_name("consequence").type != "compound_statement":
        raise NotApplicable("a pass over the cache does not have the canonical shape")
    block = inner.child_by_field_name("consequence")
    index, text = column[1], parsed.text(block)
    if _FORBIDDEN.search(text):
        raise NotApplicable(f"a pass holds `{_FORBIDDEN.search(text)[0]}`")
    for change in cp.nodes_of_type(block, "assignment_expression", "update_expression"):
        target = change.child_by_field_name("left") or change.child_by_field_name("argument")
        if target is not None and squash(parsed.text(target)).strip("()") in (index, "cache_t"):
            raise NotApplicable(f"a pass assigns {squash(parsed.text(target))}")
    return CachePass(node, bound, index, column[2], block, _accesses(parsed, block, index))


def _accesses(parsed: cp.ParsedSource, block: Node, index: str) -> tuple[Access, ...]:
    through_ldg = {call.subscript.id: call.node for call in ldg_calls(parsed, block)}
    found = []
    for node in cp.nodes_of_type(block, "subscript_expression"):
        array = parsed.text(node.child_by_field_name("argument"))
        indices = squash(parsed.text(node.child_by_field_name("indices"))).removeprefix("[").removesuffix("]")
        if array == KEY:
            if indices != "cache_t":
                raise NotApplicable(f"a pass reads the cache at [{indices}]")
            continue
        if not re.search(rf"\b{index}\b", indices):
            continue
        offset = _offset(indices, index, array)
        written = is_written(node)
        if written and not _plain_store(node, block):
            raise NotApplicable(f"a pass writes {array} other than by one `{array}[...] = ...;` that always runs")
        found.append(Access(through_ldg.get(node.id, node), array, offset, written, node.id in through_ldg))
    for array in {a.array for a in found if a.written}:
        uses = [a for a in found if a.array == array]
        if len(uses) != 1 or len(re.findall(rf"\b{array}\b", parsed.text(block))) != 1:
            raise NotApplicable(f"a pass writes {array} and uses it again")
    return tuple(found)


def _offset(indices: str, index: str, array: str) -> str:
    """X of `X + j` ("" for `j`); NotApplicable for any other index that uses j."""
    if indices == index:
        return ""
    head, plus, tail = indices.rpartition(" + ")
    if plus and tail == index and not re.search(rf"\b{index}\b", head) and _OFFSET.match(head):
        return head
    raise NotApplicable(f"{array} is read or written at [{indices}], not at [{index}] or [X + {index}]")


def _plain_store(node: Node, block: Node) -> bool:
    """`a[...] = v;` as a statement only plain blocks enclose within the pass."""
    assignment = outer_parens(node).parent
    statement = assignment.parent
    if assignment.type != "assignment_expression" or \
            assignment.child_by_field_name("operator").type != "=" or statement.type != "expression_statement":
        return False
    scope = statement.parent
    while scope is not None and scope.id != block.id:
        if scope.type != "compound_statement":
            return False
        scope = scope.parent
    return scope is not None


def _available(parsed: cp.ParsedSource, function: cp.Function, body: Node, before: int) -> set[str]:
    """Names the kernel fixes before `before` and never assigns: its parameters and the body's own declarations."""
    names = {name for name, _, _ in parameters(parsed, function)}
    for node in body.named_children:
        if node.type == "declaration" and node.end_byte <= before:
            for declarator in node.children_by_field_name("declarator"):
                while declarator.child_by_field_name("declarator") is not None:
                    declarator = declarator.child_by_field_name("declarator")
                names.add(parsed.text(declarator))
    for change in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = change.child_by_field_name("left") or change.child_by_field_name("argument")
        names.discard(squash(parsed.text(target)).strip("()") if target is not None else "")
    return names


def _factors(offset: str) -> set[str]:
    """The names multiplied at the offset's top level (`(long long)row * cols`: row and cols)."""
    if re.search(r"[+\-]", re.sub(r"\([^()]*\)", "", offset)):
        return set()
    return {re.sub(r"^\(\w[\w ]*\)", "", part.strip()).strip("() ") for part in offset.split("*")}


def _flag_text(site: Site) -> str:
    aligned = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in site.pointers)
    checks = [f"{site.bound} % {WIDTH} == 0", f"{site.bound} <= 32 * {site.size}", f"(({aligned}) & 15) == 0",
              *(f"({offset}) % {WIDTH} == 0" for offset in site.offsets)]
    return f"const bool {FLAG} = {' && '.join(checks)};"


def _vector_pass(parsed: cp.ParsedSource, site: Site, step: CachePass) -> str:
    """`if (row_vec4) { the pass, four columns a lane per step } else ` to put in front of the pass."""
    groups = list(dict.fromkeys(access.group for access in step.accesses))
    name = {group: f"cache_v{number}" for number, group in enumerate(groups)}
    loads, stores = [], []
    for number, group in enumerate(groups):
        array, offset = group
        address = f"&{array}[{offset + ' + ' if offset else ''}cache_j4]"
        uses = [a for a in step.accesses if a.group == group]
        if uses[0].written:
            loads.append(f"float {name[group]}[{WIDTH}];")
            stores.append(f"*reinterpret_cast<float4*>({address}) = make_float4("
                          + ", ".join(f"{name[group]}[{k}]" for k in range(WIDTH)) + ");")
            continue
        vector = f"reinterpret_cast<const float4*>({address})"
        read_only = array in site.read_only or all(a.through_ldg for a in uses)
        load = f"__ldg({vector})" if read_only else f"*{vector}"
        loads += [f"const float4 cache_r{number} = {load};",
                  f"const float {name[group]}[{WIDTH}] = {{" + ", ".join(
                      f"cache_r{number}.{c}" for c in "xyzw") + "};"]
    base = step.block.start_byte
    text = parsed.text(step.block)
    for access in sorted(step.accesses, key=lambda a: -a.node.start_byte):
        start, end = access.node.start_byte - base, access.node.end_byte - base
        start, end = len(parsed.data[base:base + start].decode()), len(parsed.data[base:base + end].decode())
        text = text[:start] + f"{name[access.group]}[cache_k]" + text[end:]
    indent = indentation(parsed.data, step.node.start_byte)
    unit = "    "
    inner = indent + unit * 4
    statements = text.strip()[1:-1].strip("\n")
    column = len(indentation(parsed.data, step.block.named_children[0].start_byte)) if step.block.named_children \
        else len(inner)
    lines = [f"if ({FLAG}) {{",
             f"{unit}#pragma unroll",
             f"{unit}for (int cache_q = 0; cache_q < {site.size // WIDTH}; ++cache_q) {{",
             f"{unit * 2}const int cache_j4 = {WIDTH} * ({step.lane} + 32 * cache_q);",
             f"{unit * 2}if (cache_j4 < {site.bound}) {{",
             *(f"{unit * 3}{line}" for line in loads),
             f"{unit * 3}#pragma unroll",
             f"{unit * 3}for (int cache_k = 0; cache_k < {WIDTH}; ++cache_k) {{",
             *(f"{unit * 4}const int {declared} = {value};" for declared, value in
               (("cache_t", f"{WIDTH} * cache_q + cache_k"), (step.column, "cache_j4 + cache_k"))
               if re.search(rf"\b{declared}\b", statements))]  # only what the pass uses: no unused variables
    head = "\n".join((indent + line) for line in lines)
    body = reindent(statements, column, inner)
    tail = [f"{unit * 3}}}", *(f"{unit * 3}{line}" for line in stores), f"{unit * 2}}}", f"{unit}}}", "} else "]
    return head[len(indent):] + "\n" + body.rstrip("\n") + "\n" + "\n".join(indent + line for line in tail)


register(ScalarizeRowCache())
