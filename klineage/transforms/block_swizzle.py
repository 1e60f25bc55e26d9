"""block_swizzle: replace a grouped block rasterization by plain row-major block order.

The mechanism, as the corpus writes it (gemm/mma_sync, gemm/mma_sync_any): a `__device__` helper
`void tile_coordinates(int block, int tiles_m, int tiles_n, int& tile_m, int& tile_n)` that maps
the linear block id to tile coordinates column-major inside groups of GROUP_M tile rows, so that
CTAs resident together share A rows and B columns in L2. It is recognised by structure, not by
name: a `__device__` (not `__global__`) function returning void whose parameters are three
integers (the linear id, the tile counts along m and along n, in that order) and two `int&`
outputs (tile m, tile n), whose body names a namespace-scope constant with GROUP in its name, and
which some function calls with a first argument read from `blockIdx` (directly, or through a local
initialised from it).

Anchor: the helper, kind "function", key `<helper>:<GROUP constant>`.

Backward replaces the helper's body by the linear order
    tile_m = block / tiles_n;
    tile_n = block % tiles_n;
(block b -> row b / tiles_n, column b % tiles_n). Both orders are bijections of
[0, tiles_m * tiles_n) onto the tiles, so with the grid of exactly tiles_m * tiles_n blocks every
tile is still computed once: the result is the same, only the L2 reuse of neighbouring CTAs goes.
The removed body travels in the Rewrite's carrier (`helper_body`).

Forward works from the simplified source and the anchor alone: it re-synthesises the canonical
grouped rasterization over the helper's own parameter names and the GROUP constant from the key:
    const int per_group = GROUP_M * tiles_n;
    const int group = block / per_group;
    const int first_m = group * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    const int in_group = block - group * per_group;
    tile_m = first_m + in_group % rows;
    tile_n = in_group / rows;
which is the corpus helper's body, so the round trip is byte-exact for it (another grouped helper
comes back in this canonical form, which computes a grouped order with the same group size).

Feature: the source feature reader has no `block_swizzle` feature (recognising the helper needs the
structure above, not a name or a call), so `removes` is empty.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms import register
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

_GROUP = re.compile(r"GROUP")
_INT_TYPES = ("int", "unsigned", "unsigned int", "int32_t", "uint32_t", "long long", "int64_t")
_KEY = re.compile(r"^(?P<helper>[A-Za-z_]\w*):(?P<group>[A-Za-z_]\w*)$")
_LOCALS = ("per_group", "group", "first_m", "rows", "in_group")


class _Helper:
    def __init__(self, function: cp.Function, names: tuple[str, str, str, str, str], body: Node):
        self.function, self.names, self.body = function, names, body  # names: id, count_m, count_n, out_m, out_n


def _signature(parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, str, str, str, str] | None:
    """The five parameter names of a (id, count_m, count_n, &out_m, &out_n) helper, else None."""
    if "__device__" not in function.qualifiers or function.is_kernel:
        return None
    result = function.node.child_by_field_name("type")
    if result is None or parsed.text(result) != "void":
        return None
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    if params is None:
        return None
    parameters = [p for p in params.named_children if p.type == "parameter_declaration"]
    if len(parameters) != 5:
        return None
    names = []
    for i, parameter in enumerate(parameters):
        kind = parameter.child_by_field_name("type")
        if kind is None or parsed.text(kind) not in _INT_TYPES:
            return None
        declarator = parameter.child_by_field_name("declarator")
        output = declarator is not None and declarator.type == "reference_declarator"
        if output != (i >= 3):
            return None
        if output:
            declarator = declarator.named_children[-1] if declarator.named_children else None
        if declarator is None or declarator.type != "identifier":
            return None
        names.append(parsed.text(declarator))
    return tuple(names)  # type: ignore[return-value]


def _namespace_constants(parsed: cp.ParsedSource) -> set[str]:
    return {d.name for d in cp.declarations(parsed) if d.function is None and d.constant}


def _group_constant(parsed: cp.ParsedSource, body: Node, constants: set[str]) -> str | None:
    for node in cp.nodes_of_type(body, "identifier"):
        name = parsed.text(node)
        if _GROUP.search(name) and name in constants:
            return name
    return None


def _called_with_block_id(parsed: cp.ParsedSource, name: str) -> bool:
    block_locals: dict[str | None, set[str]] = {}
    for declaration in cp.declarations(parsed):
        if declaration.init is not None and "blockIdx" in parsed.text(declaration.init):
            block_locals.setdefault(declaration.function, set()).add(declaration.name)
    for call in cp.nodes_of_type(parsed.root, "call_expression"):
        if cp.call_name(call) != name:
            continue
        arguments = call.child_by_field_name("arguments").named_children
        if not arguments:
            continue
        first = parsed.text(arguments[0])
        if "blockIdx" in first or first in block_locals.get(cp.function_of(call), set()):
            return True
    return False


def _helpers(parsed: cp.ParsedSource) -> list[_Helper]:
    found = []
    for function in cp.functions(parsed):
        names = _signature(parsed, function)
        body = function.node.child_by_field_name("body")
        if names is not None and body is not None and _called_with_block_id(parsed, function.name):
            found.append(_Helper(function, names, body))
    return found


def _indent(parsed: cp.ParsedSource, body: Node) -> tuple[str, str]:
    """(the body's own indentation, one step deeper) as the file writes them."""
    data = parsed.data
    line_start = data.rfind(b"\n", 0, body.start_byte) + 1
    outer = re.match(rb"[ \t]*", data[line_start:body.start_byte]).group().decode()
    statements = [c for c in body.named_children if c.type != "comment"]
    if statements:
        first = statements[0]
        start = data.rfind(b"\n", 0, first.start_byte) + 1
        inner = data[start:first.start_byte].decode()
        if not inner.strip():
            return outer, inner
    return outer, outer + "    "


def linear_body(names: tuple[str, ...], outer: str, inner: str) -> str:
    block, _, tiles_n, tile_m, tile_n = names
    return (f"{{\n{inner}{tile_m} = {block} / {tiles_n};\n"
            f"{inner}{tile_n} = {block} % {tiles_n};\n{outer}}}")


def grouped_body(names: tuple[str, ...], group: str, outer: str, inner: str) -> str:
    block, tiles_m, tiles_n, tile_m, tile_n = names
    lines = (f"const int per_group = {group} * {tiles_n};",
             f"const int group = {block} / per_group;",
             f"const int first_m = group * {group};",
             f"const int rows = min({tiles_m} - first_m, {group});",
             f"const int in_group = {block} - group * per_group;",
             f"{tile_m} = first_m + in_group % rows;",
             f"{tile_n} = in_group / rows;")
    return "{\n" + "".join(f"{inner}{line}\n" for line in lines) + f"{outer}}}"


def _is_linear(parsed: cp.ParsedSource, helper: _Helper) -> bool:
    outer, inner = _indent(parsed, helper.body)
    expected = re.sub(r"\s+", " ", linear_body(helper.names, outer, inner))
    return re.sub(r"\s+", " ", parsed.text(helper.body)) == expected


class BlockSwizzle(Transform):
    name = "block_swizzle"
    intent = "Order blocks in groups of tile rows so that CTAs resident together share operand tiles in L2."
    removes = ()

    def find(self, state: KernelState) -> list[Anchor]:
        parsed = cp.parse(state.source)
        constants = _namespace_constants(parsed)
        anchors = []
        for helper in _helpers(parsed):
            group = _group_constant(parsed, helper.body, constants)
            if group is not None and not _is_linear(parsed, helper):
                signature = parsed.text(helper.function.node)[:helper.body.start_byte - helper.function.node.start_byte]
                anchors.append(Anchor(helper.function.name, "function", f"{helper.function.name}:{group}",
                                      signature.strip()))
        return anchors

    def _helper(self, parsed: cp.ParsedSource, anchor: Anchor) -> tuple[_Helper, str]:
        match = _KEY.match(anchor.key) if anchor.kind == "function" else None
        if match is None or match["helper"] != anchor.function:
            raise NotApplicable(f"block_swizzle needs a function anchor keyed `<helper>:<GROUP constant>`, "
                                f"not {anchor}")
        for helper in _helpers(parsed):
            if helper.function.name == anchor.function:
                return helper, match["group"]
        raise NotApplicable(f"block_swizzle: {anchor.function} is not a block-order helper (a __device__ void "
                            f"function of (id, tiles_m, tiles_n, int& tile_m, int& tile_n) called with a blockIdx id)")

    def backward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        helper, group = self._helper(parsed, anchor)
        if _group_constant(parsed, helper.body, _namespace_constants(parsed)) != group:
            raise NotApplicable(f"block_swizzle: {anchor.function} does not group by {group}")
        outer, inner = _indent(parsed, helper.body)
        body = linear_body(helper.names, outer, inner)
        data = parsed.data
        source = (data[:helper.body.start_byte] + body.encode() + data[helper.body.end_byte:]).decode("utf-8")
        original = parsed.text(helper.body)
        canonical = original == grouped_body(helper.names, group, outer, inner)
        return self.rewrite(state, anchor, Direction.BACKWARD, source,
                            carrier={"helper_body": original, "group": group,
                                     "group_size": state.constants.get(group)},
                            note=f"{anchor.function} maps block ids to tiles in row-major order instead of groups of "
                                 f"{group} tile rows" + ("" if canonical else "; forward restores the canonical "
                                                         "grouped form, not this exact text"))

    def forward(self, state: KernelState, anchor: Anchor) -> Rewrite:
        parsed = cp.parse(state.source)
        helper, group = self._helper(parsed, anchor)
        if not _is_linear(parsed, helper):
            raise NotApplicable(f"block_swizzle: {anchor.function}'s body is not the plain row-major order "
                                f"({helper.names[3]} = {helper.names[0]} / {helper.names[2]}; ...)")
        if group not in _namespace_constants(parsed):
            raise NotApplicable(f"block_swizzle: no namespace-scope constant {group} to group by")
        clash = set(helper.names) & set(_LOCALS)
        if clash:
            raise NotApplicable(f"block_swizzle: parameter names {sorted(clash)} clash with the grouped form's locals")
        outer, inner = _indent(parsed, helper.body)
        body = grouped_body(helper.names, group, outer, inner)
        data = parsed.data
        source = (data[:helper.body.start_byte] + body.encode() + data[helper.body.end_byte:]).decode("utf-8")
        return self.rewrite(state, anchor, Direction.FORWARD, source,
                            carrier={"group": group, "group_size": state.constants.get(group)},
                            note=f"{anchor.function} orders blocks in groups of {group} tile rows")


register(BlockSwizzle())
