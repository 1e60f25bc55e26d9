"""Shared analysis for the forwards that place a mechanism on naive kernels (one thread per element or row):
which kernel an anchor names, the thread-index declaration, the parameters' types, the launches that run a
kernel and the plan with its first grid dimension rescaled.

The leading underscore keeps the catalog from loading this module as a transform.
"""

from __future__ import annotations

from collections.abc import Callable

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.launch import ArgKind, Launch, LaunchPlan
from klineage.transforms.base import Anchor, NotApplicable, with_plan

SERIAL_INDEX = "blockIdx.x * blockDim.x + threadIdx.x"  # one thread per element or row


def squash(text: str) -> str:
    """The text with every run of blanks one space: C's layout does not change what it says."""
    return " ".join(text.split())


def statements(node: Node) -> list[Node]:
    """The statements a block holds, comments left out; a lone statement is its own list."""
    return [c for c in node.named_children if c.type != "comment"] if node.type == "compound_statement" else [node]


def kernel(parsed: cp.ParsedSource, anchor: Anchor) -> cp.Function:
    """The kernel (a `__global__` definition) the anchor names."""
    for function in cp.functions(parsed):
        if function.name == anchor.function and function.is_kernel and function.node.child_by_field_name("body"):
            return function
    raise NotApplicable(f"no kernel {anchor.function}")


def index_declaration(parsed: cp.ParsedSource, body: Node, value: str, kind: str = "int") -> tuple[Node, Node, str]:
    """(declaration, its initializer, the name) of `<kind> name = <value>;` among the body's statements."""
    for statement in statements(body):
        declarators = statement.children_by_field_name("declarator") if statement.type == "declaration" else []
        declared = statement.child_by_field_name("type")
        if len(declarators) != 1 or declarators[0].type != "init_declarator" or declared is None:
            continue
        init = declarators[0].child_by_field_name("value")
        if squash(parsed.text(declared)) == kind and init is not None and squash(parsed.text(init)) == value:
            return statement, init, parsed.text(declarators[0].child_by_field_name("declarator"))
    raise NotApplicable(f"no `{kind} i = {value};`")


def parameters(parsed: cp.ParsedSource, function: cp.Function) -> list[tuple[str, str, bool]]:
    """(name, type without `const`-free qualifiers squashed, is a pointer) of each parameter, in order."""
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    found = []
    for param in declarator.child_by_field_name("parameters").named_children:
        kind, inner = param.child_by_field_name("type"), param.child_by_field_name("declarator")
        name = inner
        while name is not None and name.type != "identifier":
            name = name.child_by_field_name("declarator")
        found.append((parsed.text(name) if name is not None else "", squash(parsed.text(kind)) if kind else "",
                      inner is not None and inner.type == "pointer_declarator"))
    return found


def launches_of(state: KernelState, entry: str, *, dimensions: int) -> list[Launch]:
    """The plan's launches of `entry`; NotApplicable unless there is one, each with a grid and block of at most
    `dimensions` dimensions, passing no buffer twice (the kernel may read what it writes elsewhere)."""
    launches = [launch for launch in state.plan.launches if launch.entry == entry]
    if not launches:
        raise NotApplicable(f"the plan never launches {entry}")
    for launch in launches:
        extra = [str(d).strip() for d in (*launch.grid[dimensions:], *launch.block[dimensions:])]
        if extra != ["1"] * len(extra):
            raise NotApplicable(f"{entry}'s launch has more than {dimensions} dimension(s)")
        buffers = [arg.name for arg in launch.args if arg.kind is ArgKind.BUFFER]
        if len(buffers) != len(set(buffers)):
            raise NotApplicable(f"{entry}'s launch passes one buffer twice")
    return launches


def rescaled_grid(state: KernelState, entry: str, rescale: Callable[[str], str]) -> LaunchPlan:
    """The plan with the first grid dimension of every launch of `entry` rewritten by `rescale` (which raises
    NotApplicable for a grid it cannot read)."""
    launches = []
    for launch in state.plan.launches:
        if launch.entry == entry:
            grid = rescale(str(launch.grid[0]).strip())
            launch = Launch(launch.entry, (grid, *launch.grid[1:]), launch.block, launch.shared, launch.args)
        launches.append(launch)
    return with_plan(state, launches=tuple(launches))


def unwrapped(grid: str, before: str, after: str) -> str:
    """The grid expression a forward wrapped as `before + grid + after`; NotApplicable when it is not so wrapped."""
    if not (grid.startswith(before) and grid.endswith(after) and len(grid) > len(before) + len(after)):
        raise NotApplicable(f"the grid {grid} is not {before}...{after}")
    return grid[len(before):-len(after)]
