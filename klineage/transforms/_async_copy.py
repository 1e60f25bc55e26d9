"""cp.async roles shared by sync_copies and unpipeline: which functions and macros copy, commit and
wait (directly or through helpers), and how a wait helper gets its pending-group count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage import expr
from klineage.errors import ExpressionError
from klineage.features import cuda_parser as cp

COPY, COMMIT, WAIT = "copy", "commit", "wait"


COPY_ASM = re.compile(r"\bcp\.async\.c[ag]\b")


_COMMIT_ASM = re.compile(r"\bcp\.async\.commit_group\b")


_WAIT_ASM = re.compile(r"\bcp\.async\.wait_(?:group|all)\b")


_WAIT_OPERAND = re.compile(r"\bcp\.async\.wait_group\s+%(\d+)")


CALL_ROLES = {"__pipeline_memcpy_async": COPY, "memcpy_async": COPY, "__pipeline_commit": COMMIT,
               "__pipeline_wait_prior": WAIT}


def asm_roles(code: str) -> set[str]:
    roles = set()
    if COPY_ASM.search(code):
        roles.add(COPY)
    if _COMMIT_ASM.search(code):
        roles.add(COMMIT)
    if _WAIT_ASM.search(code):
        roles.add(WAIT)
    return roles


def direct_roles(parsed: cp.ParsedSource, node: Node) -> set[str]:
    roles: set[str] = set()
    for block in cp.nodes_of_type(node, "gnu_asm_expression"):
        code = block.child_by_field_name("assembly_code")
        roles |= asm_roles(cp.string_value(parsed, code) if code is not None else "")
    for call in cp.nodes_of_type(node, "call_expression"):
        role = CALL_ROLES.get(cp.call_name(call))
        if role:
            roles.add(role)
    return roles


def _used_names(parsed: cp.ParsedSource, node: Node) -> set[str]:
    names = {cp.call_name(call) for call in cp.nodes_of_type(node, "call_expression")}
    return names | {parsed.text(n) for n in cp.nodes_of_type(node, "identifier")}


def short_name(name: str) -> str:
    return name.rsplit("::", 1)[-1]


@dataclass(frozen=True)
class AsyncRoles:
    """Function and macro names -> the cp.async roles their code carries, through what they call."""

    by_name: dict[str, frozenset[str]]
    wait_params: dict[str, tuple[str, int]]  # wait helper -> ("template" | "argument", index) of its count

    def of(self, parsed: cp.ParsedSource, node: Node) -> set[str]:
        roles = direct_roles(parsed, node)
        for name in _used_names(parsed, node):
            roles |= self.by_name.get(name, frozenset())
        return roles


def async_roles(parsed: cp.ParsedSource) -> AsyncRoles:
    direct: dict[str, set[str]] = {}
    uses: dict[str, set[str]] = {}
    wait_params: dict[str, tuple[str, int]] = {}
    for function in cp.functions(parsed):
        name = short_name(function.name)
        direct.setdefault(name, set()).update(direct_roles(parsed, function.node))
        uses.setdefault(name, set()).update(_used_names(parsed, function.node) - {name})
        param = wait_parameter(parsed, function)
        if param is not None:
            wait_params[name] = param
    for macro in cp.macros(parsed):
        body = cp.parse_fragment(macro.body)
        direct.setdefault(macro.name, set()).update(direct_roles(body, body.root))
        uses.setdefault(macro.name, set()).update(_used_names(body, body.root) - {macro.name})
    roles = {name: set(found) for name, found in direct.items()}
    changed = True
    while changed:
        changed = False
        for name, used in uses.items():
            before = len(roles[name])
            for other in used:
                roles[name] |= roles.get(other, set())
            changed |= len(roles[name]) != before
    return AsyncRoles({name: frozenset(found) for name, found in roles.items()}, wait_params)


def asm_operands(parsed: cp.ParsedSource, block: Node) -> list[tuple[str, Node]]:
    """(constraint, value) of an asm statement's operands, outputs first, numbered as %0, %1 ..."""
    operands = []
    for field_name in ("output_operands", "input_operands"):
        operand_list = block.child_by_field_name(field_name)
        if operand_list is None:
            continue
        for operand in operand_list.named_children:
            constraint = operand.child_by_field_name("constraint")
            value = operand.child_by_field_name("value")
            if constraint is not None and value is not None:
                operands.append((cp.string_value(parsed, constraint), value))
    return operands


def parameter_names(parsed: cp.ParsedSource, function: cp.Function) -> list[str]:
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    names = []
    for param in params.named_children if params is not None else []:
        identifiers = [n for n in cp.nodes_of_type(param, "identifier") if n.parent.type != "type_identifier"]
        names.append(parsed.text(identifiers[-1]) if identifiers else "")
    return names


def wait_parameter(parsed: cp.ParsedSource, function: cp.Function) -> tuple[str, int] | None:
    """How a wait helper gets its pending-group count: ("template", i) when the asm's
    `wait_group %k` operand is its i-th template parameter, ("argument", i) for a function parameter."""
    template_names = [p.replace("...", " ").split()[-1] if p.split() else "" for p in function.template_params]
    for block in cp.nodes_of_type(function.node, "gnu_asm_expression"):
        code = block.child_by_field_name("assembly_code")
        match = _WAIT_OPERAND.search(cp.string_value(parsed, code) if code is not None else "")
        operands = asm_operands(parsed, block)
        if match is None or int(match.group(1)) >= len(operands):
            continue
        value = parsed.text(operands[int(match.group(1))][1]).strip()
        if value in template_names:
            return "template", template_names.index(value)
        params = parameter_names(parsed, function)
        if value in params:
            return "argument", params.index(value)
    return None


def call_argument(call: Node, kind: str, index: int) -> Node | None:
    if kind == "template":
        function = call.child_by_field_name("function")
        if function is None or function.type != "template_function":
            return None
        args = [a for a in function.child_by_field_name("arguments").named_children if a.type != "comment"]
    else:
        args = [a for a in call.child_by_field_name("arguments").named_children if a.type != "comment"]
    if index >= len(args):
        return None
    arg = args[index]
    if arg.type == "type_descriptor" and arg.named_child_count == 1:  # `<N>` read as a type name
        arg = arg.named_children[0]
    return arg


def wait_count(parsed: cp.ParsedSource, statement: Node, roles: AsyncRoles) -> Node | None:
    """The expression that gives a wait statement's pending-group count, where there is one."""
    for call in cp.nodes_of_type(statement, "call_expression"):
        name = cp.call_name(call)
        if name == "__pipeline_wait_prior":
            return call_argument(call, "argument", 0)
        if name in roles.wait_params:
            return call_argument(call, *roles.wait_params[name])
    return None


_INT_SUFFIX = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)\b")


def c_value(text: str, constants: dict[str, int | float]) -> int | None:
    """The integer value of a C constant expression over the file's constants, or None."""
    text = _INT_SUFFIX.sub(r"\1", text.strip())
    text = text.replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"!(?!=)", " not ", text)
    text = re.sub(r"(?<!/)/(?!/)", "//", text)
    try:
        value = expr.evaluate(text, constants)
    except (ExpressionError, RecursionError, TypeError, ValueError, ZeroDivisionError):
        return None
    if isinstance(value, bool):
        return int(value)
    return int(value) if isinstance(value, int) or (isinstance(value, float) and value.is_integer()) else None
