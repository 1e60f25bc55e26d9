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
from klineage.transforms import _row_vectors as rv
from klineage.transforms import register
from klineage.transforms._edit import Edit, indentation, own_lines, splice
from klineage.transforms._naive import kernel, launches_of, parameters, readable, squash
from klineage.transforms.base import Anchor, Direction, NotApplicable, Placement, Rewrite, Transform

FLAG = "row_vec4"
KEY = "row_cache"
_OWN_NAMES = re.compile(rf"\b(?:{FLAG}|cache_q|cache_k|cache_j4|cache_r\d+|cache_v\d+)\b")
_CACHE = re.compile(r"^float row_cache\[(\d+)\];$")
_FIT = re.compile(r"^\((\w+) <= 32 \* (\d+)\)$")
_COLUMN = re.compile(r"^const int (\w+) = (\w+) \+ 32 \* cache_t;$")


@dataclass(frozen=True)
class CachePass:
    node: Node  # the `if (n <= 32 * N)` statement
    bound: str  # n
    lane: str
    step: rv.Pass  # the statements under `if (j < n)`


@dataclass(frozen=True)
class Site:
    function: cp.Function
    declaration: Node  # float row_cache[N];
    size: int
    bound: str
    passes: tuple[CachePass, ...]
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
        return [Anchor(function.name, "function", KEY, parsed.text(function.node)[:200])
                for function, _ in readable(parsed, lambda function: _site(state, parsed, function))]

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        site = _site(state, parsed, kernel(parsed, anchor))
        indent = indentation(parsed.data, site.declaration.start_byte)
        steps = [cached.step for cached in site.passes]
        divisible, *aligned = rv.checks(site.bound, steps)
        flag = " && ".join([divisible, f"{site.bound} <= 32 * {site.size}", *aligned])
        edits = [Edit(site.declaration.end_byte, site.declaration.end_byte, f"\n{indent}const bool {FLAG} = {flag};")]
        edits += [Edit(cached.node.start_byte, cached.node.start_byte, _vector_pass(parsed, site, cached))
                  for cached in site.passes]
        source = splice(parsed.data, edits)[0].decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source, carrier={"width": rv.WIDTH},
                            note=f"{site.function.name}: row cache filled and written as float4 "
                                 f"({', '.join(rv.pointers(steps))}) when {site.bound} % {rv.WIDTH} == 0 and the "
                                 f"pointers are 16-byte aligned")

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
    return next((node for node in (cp.nodes_of_type(body, "declaration") if body is not None else ())
                 if squash(parsed.text(node)).startswith(f"const bool {FLAG} =")), None)


def _site(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> Site:
    """The kernel's row cache and its passes, or NotApplicable saying why the forward may not vectorize them."""
    body = function.node.child_by_field_name("body")
    # the cache may sit in a block (`if (row < rows) { ... }`) as well as in the kernel's body
    declaration = next((node for node in (cp.nodes_of_type(body, "declaration") if body is not None else ())
                        if _CACHE.match(squash(parsed.text(node)))), None)
    if not function.is_kernel or declaration is None:
        raise NotApplicable(f"{function.name} keeps no canonical row_cache")
    if _OWN_NAMES.search(parsed.text(function.node)):
        raise NotApplicable(f"{function.name} already names {FLAG} or one of the cache_ names the forward declares")
    size = int(_CACHE.match(squash(parsed.text(declaration)))[1])
    if size % rv.WIDTH:
        raise NotApplicable(f"the cache's {size} floats a lane are no multiple of {rv.WIDTH}")
    launches_of(state, function.name, dimensions=3)  # distinct buffers: a stored vector reaches no read row
    passes = [_pass(parsed, node, size) for node in cp.nodes_of_type(body, "if_statement")
              if _FIT.match(squash(parsed.text(node.child_by_field_name("condition"))))]
    if not passes:
        raise NotApplicable(f"{function.name} has no pass over its row_cache")
    bounds = {cached.bound for cached in passes}
    if len(bounds) != 1:
        raise NotApplicable("the passes over the cache have different bounds")
    available = _available(parsed, function, body, declaration)
    floats = rv.float_pointers(parsed, function)
    for access in (access for cached in passes for access in cached.step.accesses):
        if access.array not in floats:
            raise NotApplicable(f"{access.array} is no float pointer")
        if access.array not in available:
            raise NotApplicable(f"{access.array} is not declared, unchanged, before the cache")
        unknown = access.names - available
        if unknown:
            raise NotApplicable(f"the offset {access.offset} of {access.array} uses {sorted(unknown)[0]}, which is "
                                f"not fixed before the cache")
    return Site(function, declaration, size, bounds.pop(), tuple(passes), rv.read_only(parsed, function))


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
    return CachePass(node, bound, column[2], rv.read_pass(parsed, block, column[1], cached=(KEY, "cache_t")))


def _available(parsed: cp.ParsedSource, function: cp.Function, body: Node, cache: Node) -> set[str]:
    """Names the kernel fixes before the cache's declaration and never assigns: its parameters and what the blocks
    around the cache declare before it."""
    names = {name for name, _, _ in parameters(parsed, function)}
    block = cache.parent
    while block is not None and block.start_byte >= body.start_byte:
        for node in block.named_children:
            if node.type != "declaration" or node.end_byte > cache.start_byte:
                continue
            for declarator in node.children_by_field_name("declarator"):
                while declarator.child_by_field_name("declarator") is not None:
                    declarator = declarator.child_by_field_name("declarator")
                names.add(parsed.text(declarator))
        block = block.parent
    for change in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = change.child_by_field_name("left") or change.child_by_field_name("argument")
        names.discard(squash(parsed.text(target)).strip("()") if target is not None else "")
    return names


def _vector_pass(parsed: cp.ParsedSource, site: Site, cached: CachePass) -> str:
    """`if (row_vec4) { the pass, four columns a lane per step } else ` to put in front of the pass."""
    indent = indentation(parsed.data, cached.node.start_byte)
    unit = rv.UNIT
    step = rv.vector_step(parsed, cached.step, site.read_only, "cache_", indent + unit * 3,
                          (("cache_t", f"{rv.WIDTH} * cache_q + cache_k"), (cached.step.column, "cache_j4 + cache_k")))
    head = [f"if ({FLAG}) {{",
            f"{unit}#pragma unroll",
            f"{unit}for (int cache_q = 0; cache_q < {site.size // rv.WIDTH}; ++cache_q) {{",
            f"{unit * 2}const int cache_j4 = {rv.WIDTH} * ({cached.lane} + 32 * cache_q);",
            f"{unit * 2}if (cache_j4 < {site.bound}) {{"]
    tail = [f"{unit * 2}}}", f"{unit}}}", "} else "]
    return "\n".join([*(indent + line for line in head), step, *(indent + line for line in tail)])[len(indent):]


register(ScalarizeRowCache())
