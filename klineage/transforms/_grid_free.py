"""Whether a kernel computes the same on any number of blocks: the legality of resizing its grid.

A kernel is grid-free when every use of the block's place in the grid (`blockIdx.x`) and of the grid's extent
(`gridDim.x`) is the start or the step of a loop that strides over the grid:

    for (<type> i = [<offset> +] blockIdx.x * B + threadIdx.x; i < <bound>; i += B * gridDim.x)   (threads)
    for (<type> i = [<offset> +] blockIdx.x; i < <bound>; i += gridDim.x)                         (blocks)

B is `blockDim.x`, or the block size the plan launches the kernel with (a number, or the source constant it names);
factors and terms in either order, integer casts on the grid's coordinates read through. The start and the step may
name a local declared once at the top of the kernel as one of those values and never assigned (`const int stride =
gridDim.x * THREADS;`). Such a loop visits each of its indices exactly once, whatever the grid: only which thread
visits which index changes. A loop in the form reroll_grid_stride's forward writes (U elements a grid apart a step,
the last step's each under its own guard) is read as the plain loop it unrolls: the same elements in the same order.

Outside those loops a kernel may still do per-thread or per-block work (sum its slice's share into a warp, then one
atomic a warp); what must not depend on the grid is its effect. So outside the loops the kernel writes no global
memory except through atomics of a computed value (`atomicAdd(loss, total)`; `atomicAdd(blocks, 1)` counts blocks)
and, in the thread form, the loop's work holds no barrier (threads of one block could loop different numbers of
times on a new grid where they did not on the old). Anything that reads the grid another way is refused with the
reason: a second grid dimension, a device function or inline PTX that reads the grid, a cooperative grid, a jump out
of a loop's work, `blockIdx` or `gridDim` taken whole, a macro whose body could hide any of these. Known limit: a
write through a pointer the kernel builds from no parameter (`float* p = ...;` from an integer) is not followed; the
gate's correctness cases judge what this reading cannot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState, parse_constants
from klineage.transforms._edit import (
    contains,
    indentation,
    is_written,
    operator,
    reindent,
    splice,
    unparen,
    written_names,
)
from klineage.transforms._naive import LOOP_INDEX_TYPES, squash, statements, uncast_grid
from klineage.transforms.base import NotApplicable

SMS = "num_sms"  # the launch plan's name for the GPU's streaming multiprocessors
THREADS_PER_SM = 2048  # resident threads an SM holds, sm_70 to sm_90
MAX_BLOCKS_PER_SM = 32
UNKNOWN_BLOCKS_PER_SM = 8  # where the block size is not a plain value: a full SM of 256-thread blocks

GRID_READS = ("blockIdx.x", "gridDim.x")
STEP = "    "  # one level of indentation in the code the grid-stride forwards write
# the grid read any other way: other axes, cooperative grids and clusters, and PTX's special registers (`%%ctaid.x`
# in an asm string; `%smid`, where a block runs, changes with the grid as well)
_OTHER_READS = re.compile(r"\b(?:blockIdx|gridDim)\.[yz]\b|\b(?:this_grid|grid_group|cluster_dims)\b|"
                          r"%n?(?:ctaid|clusterid|cluster_ctaid)|%(?:smid|gridid|nsmid)")
# the atomics whose sum over threads ignores how the work was split, as long as idle threads add what changes nothing
_ATOMICS = re.compile(r"^atomic(?:Add|Sub|Max|Min|And|Or|Xor)(?:_block|_system)?$")
_JUMPS = ("break_statement", "return_statement", "goto_statement")
# what an offset before the grid index may hold: arithmetic that binds tighter than the `+` after it
_OFFSET = re.compile(r"^[\w\s().*/%+\-]+$")


# what makes a macro's body more than an expression this reading can take as it reads (`#define THREADS 128`,
# `#define MIN(a, b) ((a) < (b) ? (a) : (b))`): a statement, an assignment or a step, a barrier, a read of the grid
_HIDDEN = re.compile(r"[;{}]|\+\+|--|(?<![=!<>])=(?!=)|\b(?:blockIdx|gridDim|threadIdx|__syncthreads\w*|__syncwarp|asm|"
                     r"break|continue|return|goto)\b|%")


def _opaque_macros(parsed: cp.ParsedSource) -> set[str]:
    """The source's macros whose body could hide what this reading looks for (a statement, a jump, an assignment, a
    barrier, a read of the grid): a kernel or loop that uses one is refused."""
    return {macro.name for macro in cp.macros(parsed) if _HIDDEN.search(macro.body)}


def _check_macros(parsed: cp.ParsedSource, scope: Node, where: str) -> None:
    if used := sorted({parsed.text(n) for n in cp.nodes_of_type(scope, "identifier")} & _opaque_macros(parsed)):
        raise NotApplicable(f"{where} uses the macro {used[0]}, whose body this reading does not follow")


@dataclass(frozen=True)
class Form:
    """The two grid-stride forms: the index a thread starts at and the step."""

    name: str
    starts: tuple[str, ...]  # regexes of the start (squashed, uncast)
    steps: tuple[str, ...]


def _forms(block_names: tuple[str, ...]) -> tuple[Form, Form]:
    sizes = "|".join(re.escape(b) for b in ("blockDim.x", *block_names))
    product = rf"(?:\(?blockIdx\.x\)? \* (?:{sizes})|(?:{sizes}) \* \(?blockIdx\.x\)?)"
    return (Form("thread", (rf"{product} \+ threadIdx\.x", rf"threadIdx\.x \+ {product}"),
                 (rf"\(?(?:{sizes}) \* gridDim\.x\)?", rf"\(?gridDim\.x \* (?:{sizes})\)?")),
            Form("block", (r"\(?blockIdx\.x\)?",), (r"\(?gridDim\.x\)?",)))


def block_names(state: KernelState, entry: str) -> tuple[str, ...]:
    """How the kernel `entry` may write its block size besides blockDim.x: the plan's block, where every launch
    gives the same one and it is a number or a name (a source constant)."""
    blocks = {str(launch.block[0]).strip() for launch in state.plan.launches if launch.entry == entry}
    return tuple(b for b in blocks if re.fullmatch(r"[A-Za-z_]\w*|[1-9]\d*", b)) if len(blocks) == 1 else ()


def _matches(patterns: tuple[str, ...], text: str) -> bool:
    return any(re.fullmatch(p, text) for p in patterns)


def _names_grid(text: str, grid_locals: dict[str, GridLocal]) -> bool:
    return any(g in text for g in GRID_READS) or any(re.search(rf"\b{re.escape(name)}\b", text) for name in grid_locals)


def _plain_offset(offset: str | None, grid_locals: dict[str, GridLocal]) -> bool:
    """No offset, or one that binds tighter than the `+` after it and names no part of the grid or thread."""
    return offset is None or (_OFFSET.fullmatch(offset) is not None and not _names_grid(offset, grid_locals)
                              and "threadIdx" not in offset)


@dataclass(frozen=True)
class GridLocal:
    form: str  # "thread" or "block"
    role: str  # "start" or "step"
    declaration: Node


def _grid_locals(parsed: cp.ParsedSource, body: Node, forms: tuple[Form, Form],
                 written: set[str]) -> dict[str, GridLocal]:
    """The kernel's top-level locals declared as a grid index or extent and never assigned (`written`: the names the
    kernel assigns), by name."""
    found: dict[str, GridLocal] = {}
    for statement in statements(body):
        declared = re.fullmatch(rf"(?:const )?(?:{LOOP_INDEX_TYPES}) ([A-Za-z_]\w*) = (.+);",
                                uncast_grid(squash(parsed.text(statement))))
        if statement.type != "declaration" or declared is None or declared[1] in written:
            continue
        for form in forms:
            for role, patterns in (("start", form.starts), ("step", form.steps)):
                if _matches(patterns, declared[2]):
                    found.setdefault(declared[1], GridLocal(form.name, role, statement))
    return found


def _loop_form(parsed: cp.ParsedSource, loop: Node, forms: tuple[Form, Form],
               grid_locals: dict[str, GridLocal], written: set[str]) -> str:
    """The form of a loop whose header reads the grid, or NotApplicable with the reason (`written`: the names the
    kernel assigns)."""
    initializer, condition, update = (loop.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    declared = re.fullmatch(rf"(?:{LOOP_INDEX_TYPES}) ([A-Za-z_]\w*) = (.+);",
                            uncast_grid(squash(parsed.text(initializer)))) if initializer is not None else None
    if declared is None:
        raise NotApplicable("a loop reads the grid in a header that declares no index")
    index, start = declared.groups()
    found = None
    for form in forms:
        # `[<offset> + ]<start>`, the start written out or a local declared as it
        if any((m := re.fullmatch(rf"(?:(.+) \+ )?(?:{pattern})", start)) and _plain_offset(m[1], grid_locals)
               for pattern in form.starts):
            found = form
        local = re.fullmatch(r"(?:(.+) \+ )?([A-Za-z_]\w*)", start)
        if local and local[2] in grid_locals and (grid_locals[local[2]].form, grid_locals[local[2]].role) == \
                (form.name, "start") and _plain_offset(local[1], grid_locals):
            found = form
    if found is None:
        raise NotApplicable(f"loop over '{index}' starts at `{start}`, not at a thread's or a block's place in "
                            "the grid")
    test = squash(parsed.text(unparen(condition))) if condition is not None else ""
    bound = re.fullmatch(rf"{re.escape(index)} < (.+)", test)
    if bound is None or _names_grid(bound[1], grid_locals) or "threadIdx" in bound[1] or \
            re.search(rf"\b{re.escape(index)}\b", bound[1]):
        raise NotApplicable(f"loop over '{index}' is not bounded by `{index} < n` with n free of the grid")
    step = re.fullmatch(rf"{re.escape(index)} (?:\+= |= {re.escape(index)} \+ )(.+)",
                        uncast_grid(squash(parsed.text(update)))) if update is not None else None
    stepped = step is not None and (_matches(found.steps, step[1]) or (
        step[1] in grid_locals and (grid_locals[step[1]].form, grid_locals[step[1]].role) == (found.name, "step")))
    if not stepped:
        raise NotApplicable(f"loop over '{index}' does not step by the grid's extent in {found.name}s")
    work = loop.child_by_field_name("body")
    _check_macros(parsed, loop, f"loop over '{index}'")
    if any(parsed.text(n) == index and is_written(n) for n in cp.nodes_of_type(work, "identifier")):
        raise NotApplicable(f"loop over '{index}' assigns its index in its work")
    moved = written & set(re.findall(r"[A-Za-z_]\w*", bound[1]))
    if moved:
        raise NotApplicable(f"loop over '{index}' is bounded by '{sorted(moved)[0]}', which the kernel assigns")
    if cp.nodes_of_type(work, *_JUMPS):
        raise NotApplicable(f"loop over '{index}' can leave its work early (break, return or goto)")
    if found.name == "thread" and any(cp.call_name(c).startswith(("__syncthreads", "__syncwarp", "__barrier"))
                                      for c in cp.nodes_of_type(work, "call_expression")):
        raise NotApplicable(f"loop over '{index}' holds a barrier: on another grid the block's threads could loop "
                            "different numbers of times")
    return found.name


@dataclass(frozen=True)
class StridedLoop:
    """A loop that strides over the grid, its header's parts as written."""

    loop: Node
    form: str  # "thread" or "block"
    kind: str  # the index's type
    index: str
    start: str
    bound: str
    stride: str
    work: Node


def strided_loops(parsed: cp.ParsedSource, function: cp.Function, block_names: tuple[str, ...],
                  left_out: list[str] | None = None) -> list[StridedLoop]:
    """The loops of the kernel `function` that stride over the grid in one of the two forms, in source order; a
    loop that reads the grid any other way, or whose work could leave it early, is left out (why, in `left_out`)."""
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        return []
    return _strided(parsed, body, block_names, [] if left_out is None else left_out)[0]


def _strided(parsed: cp.ParsedSource, body: Node, block_names: tuple[str, ...],
             left_out: list[str]) -> tuple[list[StridedLoop], dict[str, GridLocal]]:
    """(the body's grid-stride loops, its grid locals); why each loop that reads the grid otherwise was left out, in
    `left_out`."""
    forms = _forms(block_names)
    written = written_names(parsed, body)
    grid_locals = _grid_locals(parsed, body, forms, written)
    found = []
    for loop in cp.nodes_of_type(body, "for_statement"):
        initializer, condition, update = (loop.child_by_field_name(f) for f in ("initializer", "condition", "update"))
        if not any(p is not None and _names_grid(parsed.text(p), grid_locals) for p in (initializer, update)):
            continue
        try:
            form = _loop_form(parsed, loop, forms, grid_locals, written)
        except NotApplicable as error:
            left_out.append(str(error))
            continue
        (declarator,) = initializer.children_by_field_name("declarator")
        step = unparen(update).child_by_field_name("right")
        if operator(unparen(update)) == "=":
            step = unparen(step).child_by_field_name("right")
        found.append(StridedLoop(loop, form, parsed.text(initializer.child_by_field_name("type")),
                                 parsed.text(declarator.child_by_field_name("declarator")),
                                 parsed.text(declarator.child_by_field_name("value")),
                                 parsed.text(unparen(condition).child_by_field_name("right")), parsed.text(step),
                                 loop.child_by_field_name("body")))
    return found, grid_locals


def _unrolled_step(parsed: cp.ParsedSource, block: Node | None, i: str, u: str, kind: str,
                   stride: str) -> Node | None:
    """The work of `block` when it is `#pragma unroll` and one loop over `i_step` < U declaring `i` a grid apart
    (`const T i = i_base + i_step * (stride);`), then the work: the statement after that declaration, None where
    `block` is otherwise."""
    inside = statements(block) if block is not None and block.type == "compound_statement" else []
    loops = [s for s in inside if s.type == "for_statement"]
    if len(loops) != 1 or [s for s in inside if s is not loops[0] and not cp.pragma_text(s)]:
        return None
    inner = loops[0]
    steps = statements(inner.child_by_field_name("body"))
    if len(steps) != 2 or re.search(rf"\b{i}_(?:base|step)\b", parsed.text(steps[1])):
        return None
    said = (squash(parsed.text(inner)[:inner.child_by_field_name("body").start_byte - inner.start_byte]),
            squash(parsed.text(steps[0])))
    expected = (f"for (int {i}_step = 0; {i}_step < {u}; ++{i}_step)",
                f"const {kind} {i} = {i}_base + {i}_step * ({stride});")
    return steps[1] if said == expected else None


def unrolled_loops(parsed: cp.ParsedSource, function: cp.Function) -> list[tuple[Node, int, str]]:
    """(outer loop, U, the plain loop's text) for every loop of `function` in the form reroll_grid_stride's forward
    writes (U elements a grid apart a step: a full step's unguarded, the last step's each under its own guard),
    whose work names neither counter and is the same in both."""
    found = []
    for outer in cp.nodes_of_type(function.node, "for_statement"):
        body = outer.child_by_field_name("body")
        inside = statements(body) if body is not None and body.type == "compound_statement" else []
        header = squash(parsed.text(outer)[:body.start_byte - outer.start_byte]) if body is not None else ""
        match = re.fullmatch(r"for \((?P<kind>[\w ]+?) (?P<i>[A-Za-z_]\w*)_base = (?P<start>.+); (?P=i)_base < "
                             r"(?P<bound>.+); (?P=i)_base \+= (?P<u>[1-9]\d*) \* \((?P<stride>.+)\)\)", header)
        if match is None or len(inside) != 1 or inside[0].type != "if_statement":
            continue
        i, u, kind, bound, stride = match["i"], match["u"], match["kind"], match["bound"], match["stride"]
        split = inside[0]
        alternative = split.child_by_field_name("alternative")
        if squash(parsed.text(split.child_by_field_name("condition"))) != \
                f"({i}_base + {int(u) - 1} * ({stride}) < {bound})" or alternative is None:
            continue
        full = _unrolled_step(parsed, split.child_by_field_name("consequence"), i, u, kind, stride)
        guard = _unrolled_step(parsed, alternative.named_children[-1], i, u, kind, stride)
        if full is None or guard is None or guard.type != "if_statement" or \
                guard.child_by_field_name("alternative") is not None:
            continue
        work = guard.child_by_field_name("consequence")
        if squash(parsed.text(guard)[:work.start_byte - guard.start_byte]) != f"if ({i} < {bound})" or \
                squash(parsed.text(work)) != squash(parsed.text(full)):
            continue
        indent = indentation(parsed.data, outer.start_byte)
        text = reindent(parsed.text(work), len(indent) + 3 * len(STEP), indent).removeprefix(indent)
        head = f"for ({kind} {i} = {match['start']}; {i} < {bound}; {i} += {stride})"
        # a braceless work goes on a line of its own, one step in
        found.append((outer, int(u), f"{head} {text}" if work.type == "compound_statement" else
                      f"{head}\n{indent}{STEP}{text}"))
    return found


def check_grid_free(parsed: cp.ParsedSource, function: cp.Function, block_names: tuple[str, ...]) -> None:
    """NotApplicable with the reason unless the kernel `function` computes the same on any number of blocks (see the
    module's docstring)."""
    if rolled := unrolled_loops(parsed, function):  # read as the plain loops: the same elements in the same order
        parsed = cp.parse(splice(parsed.data, [(loop.start_byte, loop.end_byte, text) for loop, _, text in rolled])[0]
                          .decode("utf-8"))
        function = next(f for f in cp.functions(parsed) if f.name == function.name and f.is_kernel)
    body = function.node.child_by_field_name("body")
    if not function.is_kernel or body is None:
        raise NotApplicable(f"{function.name} is not a kernel")
    for other in cp.functions(parsed):
        if not other.is_kernel and re.search(r"\b(?:blockIdx|gridDim)\b", parsed.text(other.node)):
            raise NotApplicable(f"{function.name}: the device function {other.name} reads the grid")
    if (other := _OTHER_READS.search(parsed.text(body))) is not None:
        raise NotApplicable(f"{function.name} reads `{other[0]}`: the grid beyond blockIdx.x and gridDim.x, which "
                            "this reading does not follow")
    _check_macros(parsed, body, function.name)
    for whole in (n for n in cp.nodes_of_type(body, "identifier") if parsed.text(n) in ("blockIdx", "gridDim")):
        if whole.parent is None or whole.parent.type != "field_expression":
            raise NotApplicable(f"{function.name} takes `{parsed.text(whole)}` whole (line "
                                f"{whole.start_point.row + 1}): its parts are not followed")
    if cp.nodes_of_type(body, "reference_declarator"):
        raise NotApplicable(f"{function.name} declares a reference: a store through it is not followed")
    left_out: list[str] = []
    loops, grid_locals = _strided(parsed, body, block_names, left_out)
    if left_out:
        raise NotApplicable(left_out[0])
    if not loops:
        raise NotApplicable(f"{function.name} has no grid-stride loop: every block would do the same work")
    headers = [part for found in loops for part in (found.loop.child_by_field_name("initializer"),
                                                    found.loop.child_by_field_name("update"))]
    declarations = [local.declaration for local in grid_locals.values()]
    for node in cp.nodes_of_type(body, "field_expression", "identifier"):
        said = squash(parsed.text(node))
        if node.type == "field_expression" and said in GRID_READS:
            allowed = headers + declarations
        elif node.type == "identifier" and said in grid_locals and not _declares(node):
            allowed = headers
        else:
            continue
        if not any(contains(part, node) for part in allowed):
            raise NotApplicable(f"{function.name} reads `{said}` (line {node.start_point.row + 1}) outside the start "
                                "or step of a grid-stride loop: its work would change with the grid")
    _check_writes_outside(parsed, function, body, [found.loop for found in loops])


def _declares(node: Node) -> bool:
    return node.parent is not None and node.parent.type == "init_declarator" and \
        node.parent.child_by_field_name("declarator") == node


def _values(parsed: cp.ParsedSource, body: Node) -> set[str]:
    """The names the kernel declares as values (scalars, structs, arrays: local or shared), not as pointers."""
    names = set()
    for declaration in cp.nodes_of_type(body, "declaration"):
        for declarator in declaration.children_by_field_name("declarator"):
            if declarator.type == "init_declarator":
                declarator = declarator.child_by_field_name("declarator")
            while declarator is not None and declarator.type == "array_declarator":
                declarator = declarator.child_by_field_name("declarator")
            if declarator is not None and declarator.type == "identifier":
                names.add(parsed.text(declarator))
    return names


def _base(node: Node) -> Node:
    """What a store's target indexes or selects from (`a` of `a[i].x`)."""
    while node.type in ("subscript_expression", "field_expression", "parenthesized_expression"):
        node = node.child_by_field_name("argument") or node.named_children[0]
    return node


def _check_writes_outside(parsed: cp.ParsedSource, function: cp.Function, body: Node, loops: list[Node]) -> None:
    """Outside the grid-stride loops, a store through a pointer or an atomic of a constant happens once per thread
    or block: the grid would decide its effect."""
    values = _values(parsed, body)

    def outside(node: Node) -> bool:
        return not any(contains(loop, node) for loop in loops)

    for assignment in cp.nodes_of_type(body, "assignment_expression", "update_expression"):
        target = unparen(assignment.child_by_field_name("left") or assignment.child_by_field_name("argument"))
        if target.type == "identifier" or not outside(target):
            continue
        base = _base(target)
        if base.type != "identifier" or parsed.text(base) not in values:
            raise NotApplicable(f"{function.name} stores to `{squash(parsed.text(target))}` outside its grid-stride "
                                f"loops (line {target.start_point.row + 1}): once per thread or block, so the grid "
                                "decides it")
    for call in (c for c in cp.nodes_of_type(body, "call_expression") if outside(c)):
        name, arguments = cp.call_name(call), call.child_by_field_name("arguments").named_children
        if name.startswith("__st") or name.startswith("atomic") and not _ATOMICS.match(name):
            raise NotApplicable(f"{function.name} stores with `{name}` outside its grid-stride loops: once per "
                                "thread or block, so the grid decides it")
        if _ATOMICS.match(name) and len(arguments) >= 2 and unparen(arguments[1]).type == "number_literal":
            raise NotApplicable(f"{function.name}'s `{squash(parsed.text(call))}` outside its grid-stride loops "
                                "counts threads or blocks: the grid decides it")
    for block in cp.nodes_of_type(body, "gnu_asm_expression"):
        if outside(block) and re.search(r"\b(?:st|red|atom)\.", parsed.text(block)):
            raise NotApplicable(f"{function.name}'s inline PTX stores outside its grid-stride loops: once per thread "
                                "or block, so the grid decides it")


def blocks_per_sm(state: KernelState, entry: str) -> int:
    """Blocks of the kernel's size an SM holds at once by threads (UNKNOWN_BLOCKS_PER_SM where the size is not a
    plain value): `SMS * blocks_per_sm` blocks fill the GPU once."""
    sizes = {str(launch.block[0]).strip() for launch in state.plan.launches if launch.entry == entry}
    try:
        threads = expr.evaluate_int(sizes.pop(), parse_constants(state.source)) if len(sizes) == 1 else 0
    except ExpressionError:
        threads = 0
    return max(1, min(MAX_BLOCKS_PER_SM, THREADS_PER_SM // threads)) if threads > 0 else UNKNOWN_BLOCKS_PER_SM
