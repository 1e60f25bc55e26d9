"""The 16-byte vector step of a warp's walk over a row, for `scalarize_row_cache` (uncache_row's register cache,
its passes): how a pass is read and how its vector form is written.

A pass's statements run once per column `j`; its vector step: a lane takes four
consecutive columns (`J4 = 4 * (...)`); every float array the statements read at `[j]` or `[X + j]` is loaded once
per step as a `float4` (through `__ldg` where the statements read it so or the kernel cannot write it), the
statements run once per column on registers (`j = J4 + K`), and every float array they write at `[X + j]` is
stored once per step as a `float4`, after the four columns ran. That is exact only where the row length divides by
4 and every vectorized pointer, and every offset X, is 16-byte aligned: the transform checks those at run time
and keeps the scalar walk verbatim for the rest.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.transforms._edit import indentation, is_written, ldg_calls, outer_parens, params, reindent
from klineage.transforms._naive import squash
from klineage.transforms.base import NotApplicable

WIDTH = 4
UNIT = "    "
_FORBIDDEN = re.compile(r"\b(?:__shfl\w*|__sync\w*|atomic\w*|return|break|continue|goto|asm)\b")
_OFFSET = re.compile(r"^[\w\s()*+\-]+$")  # names, numbers, casts and integer arithmetic
# a float pointer's declaration however it is qualified (`const float* __restrict__ p`, `float const* const p`),
# and one to const floats: the name is the group
_QUALIFIERS = r"\s*\*\s*(?:(?:const|__restrict__)\s+)*(\w+)"
_FLOAT_POINTER = re.compile(rf"\bfloat(?:\s+const)?{_QUALIFIERS}")
CONST_FLOAT_POINTER = re.compile(rf"\b(?:const\s+float|float\s+const){_QUALIFIERS}")
_TYPE_WORDS = {"long", "int", "unsigned"}


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

    @property
    def names(self) -> set[str]:
        """The array and the names of its offset: what must stay fixed while the pass runs."""
        return {self.array} | set(re.findall(r"\b[A-Za-z_]\w*\b", self.offset)) - _TYPE_WORDS


@dataclass(frozen=True)
class Pass:
    """Statements run once per column `column` (a compound statement, or one statement)."""

    body: Node
    column: str
    accesses: tuple[Access, ...]


def read_pass(parsed: cp.ParsedSource, body: Node, column: str, cached: tuple[str, str]) -> Pass:
    """The pass's row accesses; NotApplicable where four columns a lane would not compute the same. `cached`:
    (array, index) of the register array the pass may use, at that index only."""
    text = parsed.text(body)
    if _FORBIDDEN.search(text):
        raise NotApplicable(f"a pass holds `{_FORBIDDEN.search(text)[0]}`")
    for change in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = change.child_by_field_name("left") or change.child_by_field_name("argument")
        if target is not None and squash(parsed.text(target)).strip("()") in (column, cached[1]):
            raise NotApplicable(f"a pass assigns {squash(parsed.text(target))}")
    through_ldg = {call.subscript.id: call.node for call in ldg_calls(parsed, body)}
    found = []
    for node in cp.nodes_of_type(body, "subscript_expression"):
        array = parsed.text(node.child_by_field_name("argument"))
        indices = squash(parsed.text(node.child_by_field_name("indices"))).removeprefix("[").removesuffix("]")
        if array == cached[0]:
            if indices != cached[1]:
                raise NotApplicable(f"a pass reads {array} at [{indices}]")
            continue
        if not re.search(rf"\b{column}\b", indices):
            continue
        written = is_written(node)
        if written and not _plain_store(node, body):
            raise NotApplicable(f"a pass writes {array} other than by one `{array}[...] = ...;` that always runs")
        found.append(Access(through_ldg.get(node.id, node), array, offset_of(indices, column, array), written,
                            node.id in through_ldg))
    for array in {a.array for a in found if a.written}:
        if len([a for a in found if a.array == array]) != 1 or len(re.findall(rf"\b{array}\b", text)) != 1:
            raise NotApplicable(f"a pass writes {array} and uses it again")
    return Pass(body, column, tuple(found))


def offset_of(indices: str, index: str, array: str) -> str:
    """X of `X + j` ("" for `j`); NotApplicable for any other index that uses j."""
    if indices == index:
        return ""
    head, plus, tail = indices.rpartition(" + ")
    if plus and tail == index and not re.search(rf"\b{index}\b", head) and _OFFSET.match(head):
        return head
    raise NotApplicable(f"{array} is read or written at [{indices}], not at [{index}] or [X + {index}]")


def _plain_store(node: Node, body: Node) -> bool:
    """`a[...] = v;` as a statement only plain blocks enclose within the pass."""
    assignment = outer_parens(node).parent
    statement = assignment.parent
    if assignment.type != "assignment_expression" or \
            assignment.child_by_field_name("operator").type != "=" or statement.type != "expression_statement":
        return False
    scope = statement
    while scope is not None and scope.id != body.id:
        scope = scope.parent
        if scope is not None and scope.id != body.id and scope.type != "compound_statement":
            return False
    return scope is not None


def float_pointers(parsed: cp.ParsedSource, function: cp.Function) -> set[str]:
    return set(_FLOAT_POINTER.findall(parsed.text(function.node)))


def read_only(parsed: cp.ParsedSource, function: cp.Function) -> frozenset[str]:
    """The `const float*` parameters, and the `const float*` locals the body starts at one of them, of a kernel
    without `const_cast` (whose launch passes no buffer twice): memory nothing in the launch writes."""
    if "const_cast" in parsed.text(function.node):
        return frozenset()
    constant = {param.name for param in params(parsed, function.node)
                if param.indirection == "*" and CONST_FLOAT_POINTER.match(squash(parsed.text(param.node)))}
    for node in cp.nodes_of_type(function.node.child_by_field_name("body"), "declaration"):
        local = re.match(rf"{CONST_FLOAT_POINTER.pattern} = &?\(?(\w+)\b", squash(parsed.text(node)))
        if local and local[2] in constant:
            constant.add(local[1])
    return frozenset(constant)


def factors(offset: str) -> set[str]:
    """The names multiplied at the offset's top level (`(long long)row * cols`: row and cols)."""
    if re.search(r"[+\-]", re.sub(r"\([^()]*\)", "", offset)):
        return set()
    return {re.sub(r"^\(\w[\w ]*\)", "", part.strip()).strip("() ") for part in offset.split("*")}


def checks(bound: str, passes: Iterable[Pass]) -> list[str]:
    """What makes the vector walk exact: the bound divisible by 4, every vectorized pointer 16-byte aligned, every
    offset without the bound as a factor a multiple of 4."""
    pointers, offsets = [], []
    for step in passes:
        for access in step.accesses:
            pointers += [access.array] if access.array not in pointers else []
            if access.offset and bound not in factors(access.offset) and access.offset not in offsets:
                offsets.append(access.offset)
    aligned = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in pointers)
    return [f"{bound} % {WIDTH} == 0", *([f"(({aligned}) & 15) == 0"] if pointers else []),
            *(f"({offset}) % {WIDTH} == 0" for offset in offsets)]


def pointers(passes: Iterable[Pass]) -> list[str]:
    return list(dict.fromkeys(access.array for step in passes for access in step.accesses))


def vector_step(parsed: cp.ParsedSource, step: Pass, constant: frozenset[str], prefix: str, indent: str,
                declared: tuple[tuple[str, str], ...]) -> str:
    """The lines of one vector step at `indent`, for the four columns from `{prefix}j4`: the loads, the pass once
    per column `{prefix}k` (after `declared`: (name, value) declarations the statements use, the column's among
    them), the stores."""
    groups = list(dict.fromkeys(access.group for access in step.accesses))
    name = {group: f"{prefix}v{number}" for number, group in enumerate(groups)}
    loads, stores = [], []
    for number, group in enumerate(groups):
        array, offset = group
        address = f"&{array}[{offset + ' + ' if offset else ''}{prefix}j4]"
        uses = [a for a in step.accesses if a.group == group]
        if uses[0].written:
            loads.append(f"float {name[group]}[{WIDTH}];")
            stores.append(f"*reinterpret_cast<float4*>({address}) = make_float4("
                          + ", ".join(f"{name[group]}[{k}]" for k in range(WIDTH)) + ");")
            continue
        vector = f"reinterpret_cast<const float4*>({address})"
        load = f"__ldg({vector})" if array in constant or all(a.through_ldg for a in uses) else f"*{vector}"
        loads += [f"const float4 {prefix}r{number} = {load};",
                  f"const float {name[group]}[{WIDTH}] = {{" + ", ".join(f"{prefix}r{number}.{c}" for c in "xyzw")
                  + "};"]
    base, text = step.body.start_byte, parsed.text(step.body)
    for access in sorted(step.accesses, key=lambda a: -a.node.start_byte):
        start = len(parsed.data[base:access.node.start_byte].decode())
        end = len(parsed.data[base:access.node.end_byte].decode())
        text = text[:start] + f"{name[access.group]}[{prefix}k]" + text[end:]
    inner = indent + UNIT
    if step.body.type == "compound_statement":
        statements = text.strip()[1:-1].strip("\n")
        first = step.body.named_children[0] if step.body.named_children else step.body
        body = reindent(statements, len(indentation(parsed.data, first.start_byte)), inner)
    else:
        body = inner + text
    head = [*loads, "#pragma unroll", f"for (int {prefix}k = 0; {prefix}k < {WIDTH}; ++{prefix}k) {{"]
    uses = [f"{UNIT}const int {variable} = {value};" for variable, value in declared
            if re.search(rf"\b{variable}\b", body)]  # only what the pass uses: no unused variables
    return "\n".join([*(indent + line for line in head + uses), body.rstrip("\n"), indent + "}",
                      *(indent + line for line in stores)])
