"""An elementwise kernel over an NCHW tensor on a 3-D grid, its channel a layer along y and its image a layer along
z, read as the 2-D form `_flatten` reads (a row of blocks per row, the row from `blockIdx.y`):

    int p = blockIdx.x * blockDim.x + threadIdx.x;        int p = blockIdx.x * blockDim.x + threadIdx.x;
    int c = blockIdx.y;                                   int layer = blockIdx.y;
    int n = blockIdx.z;                             ->    int c = layer % C;
    if (p < HW) {                                         int n = layer / C;
        size_t idx = ((size_t)n * C + c) * HW + p;        if (p < HW) {
        y[idx] = x[idx] * s[c];                               size_t idx = (long long)layer * HW + p;
    }                                                         y[idx] = x[idx] * s[c];
                                                          }

on a grid (X, C * N), the kernel given the layer count as a last parameter (`int layers`, passed C * N). Where every
launch has a 1-D block and a grid of C layers along y (C the value it passes for a scalar parameter), the layer
`n * C + c` runs over the same (n, c) pairs once each, so c and n are what they were; every expression that is
a multiple of n * C + c plus terms free of n and c (compared as polynomials, `_polynomials.py`) is written over the
layer, the same value (formed in 64 bits where the expression cast a part to 64 bits). `_flatten` then makes it one
thread per element on a 1-D launch; the joined grid is never launched itself (its y could pass 65,535), and where
`_flatten` cannot read the joined kernel the kernel is left as written.

The layers may be declared before the guard or right after one that returns (`if (p >= HW) return; int64_t c =
blockIdx.y; ...`: a block's, whichever thread), in 32 or 64 bits. Legal only where c and n are never assigned and
the guard does not name them. The leading underscore keeps the
catalog from loading this module as a transform.
"""

from __future__ import annotations

import re
from dataclasses import replace

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import Arg, ArgKind
from klineage.transforms._canonical import WIDE_TYPES
from klineage.transforms._edit import fresh_name, is_written, line_end, line_start, splice
from klineage.transforms._naive import grid_extent_parameters, grid_index, launches_of, squash, statements
from klineage.transforms._polynomials import Poly, as_text, constant, plus, polynomial, times, variable
from klineage.transforms.base import NotApplicable, with_plan

_LAYER = re.compile(rf"(?:const )?(int|unsigned|unsigned int|{'|'.join(sorted(WIDE_TYPES))}) ([A-Za-z_]\w*) = "
                    rf"\(?blockIdx\.([yz])\)?;")


def layers_joined(state: KernelState, parsed: cp.ParsedSource, function: cp.Function) -> KernelState:
    """The state with the kernel `function` in the joined form above; NotApplicable where it is not so."""
    listed = statements(function.node.child_by_field_name("body"))
    at = next((k for k, node in enumerate(listed) if node.type == "if_statement"), len(listed))
    returning = at < len(listed) and squash(parsed.text(listed[at].child_by_field_name("consequence"))) in (
        "return;", "{ return; }")
    # the layers declared before the guard, or right after one that returns (each a block's, whichever thread)
    window = listed[:at] + (listed[at + 1:at + 3] if returning else [])
    found = {m[3]: (node, m[1], m[2]) for node in window if (m := _LAYER.fullmatch(squash(parsed.text(node))))}
    columns = [node for node in listed[:at] if grid_index(parsed, node, wide=True)[0] == "x"]
    if set(found) != {"y", "z"} or len(columns) != 1 or at == len(listed):
        raise NotApplicable(f"{function.name} does not declare a column along x and layers along y and z by its "
                            f"guard")
    (y_node, y_type, channel), (z_node, z_type, image) = found["y"], found["z"]
    written = {parsed.text(n) for n in cp.nodes_of_type(function.node, "identifier") if is_written(n)}
    guard = listed[at].child_by_field_name("condition")
    if {channel, image} & (written | {parsed.text(n) for n in cp.nodes_of_type(guard, "identifier")}):
        raise NotApplicable(f"{function.name} assigns {channel} or {image}, or its guard names one")
    for launch in launches_of(state, function.name, dimensions=3):
        if str(launch.block[1]).strip() != "1" or str(launch.block[2]).strip() != "1":
            raise NotApplicable(f"{function.name}'s block is not 1-D: its layers are not blockIdx.y and z alone")
    counts = sorted(grid_extent_parameters(state, parsed, function, 1)[0])
    if not counts:
        raise NotApplicable(f"no scalar parameter is passed as every grid's extent along y: {channel}'s count")
    taken = {parsed.text(n) for n in cp.nodes_of_type(parsed.root, "identifier")}
    layer, layers = fresh_name(taken, "layer"), fresh_name(taken, "layers")
    edits = _over_layer(parsed, function, channel, image, counts[0], layer)
    column = columns[0]
    indent = " " * (column.start_byte - line_start(parsed.data, column.start_byte))
    edits += [(column.end_byte, column.end_byte, f"\n{indent}int {layer} = blockIdx.y;\n{indent}{y_type} {channel} = "
                                                 f"{layer} % {counts[0]};\n{indent}{z_type} {image} = {layer} / "
                                                 f"{counts[0]};")]
    edits += [(line_start(parsed.data, node.start_byte), line_end(parsed.data, node.end_byte), "")
              for node in (y_node, z_node)]
    last = function.node.child_by_field_name("declarator").child_by_field_name("parameters").named_children[-1]
    edits.append((last.end_byte, last.end_byte, f", int {layers}"))
    launches = tuple(replace(launch, grid=(launch.grid[0], f"({launch.grid[1]}) * ({launch.grid[2]})", 1),
                             args=(*launch.args, Arg(ArgKind.SCALAR, value=f"({launch.grid[1]}) * ({launch.grid[2]})",
                                                     type="i32")))
                     if launch.entry == function.name else launch for launch in state.plan.launches)
    source = splice(parsed.data, edits)[0].decode("utf-8")
    return KernelState(source=source, plan=with_plan(state, launches=launches))


def _over_layer(parsed: cp.ParsedSource, function: cp.Function, channel: str, image: str, count: str,
                layer: str) -> list[tuple[int, int, str]]:
    """The edits writing each outermost expression of the body that is a multiple of `image * count + channel`
    plus terms free of both (`((size_t)n * C + c) * HW + p`) over the layer (`(long long)layer * HW + p`)."""
    joined = plus(times(variable(image), variable(count)), variable(channel))
    edits, covered = [], []
    for node in cp.nodes_of_type(function.node.child_by_field_name("body"), "binary_expression"):
        if any(a <= node.start_byte < b for a, b in covered):
            continue
        named = {parsed.text(n) for n in cp.nodes_of_type(node, "identifier")}
        if image not in named:
            continue
        names = {name: variable(name) for name in named}
        poly = polynomial(parsed, node, names, through_casts=True)
        factor = _cofactor(poly, channel, image) if poly is not None else None
        if factor is None:
            continue
        rest = plus(poly, times(times(joined, factor), constant(-1)))
        if any(channel in monomial or image in monomial for monomial, _ in rest):
            continue
        wide = "(long long)" if re.search(r"\b(?:long|size_t|int64_t|uint64_t|ptrdiff_t)\b", parsed.text(node)) \
            else ""
        scaled = f"{wide}{layer}" if factor == constant(1) else f"{wide}{layer} * ({as_text(factor)})"
        edits.append((node.start_byte, node.end_byte, f"{scaled} + {as_text(rest)}" if rest else scaled))
        covered.append((node.start_byte, node.end_byte))
    return edits


def _cofactor(poly: Poly, channel: str, image: str) -> Poly | None:
    """A where `poly` has the terms A * channel (A free of channel and image), else None."""
    terms = [(tuple(name for name in monomial if name != channel), coefficient) for monomial, coefficient in poly
             if monomial.count(channel) == 1 and image not in monomial]
    return Poly(terms) if terms else None
