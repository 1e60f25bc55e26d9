"""Inline-PTX helpers shared by the transforms that rewrite `asm` statements (ldmatrix, mma, wgmma,
shuffles): reading and rendering asm operands, the marker comments that let a backward step be undone,
lane and warp index expressions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from klineage.features import cuda_parser as cp
from klineage.kernel import KernelState
from klineage.transforms._edit import indentation, splice
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform

FULL_MASK = "0xffffffffu"


MARKER = "// scalarized "  # the comment that records the replaced asm statement


LINE_WIDTH = 120  # where the canonical asm layout splits its template string


@dataclass(frozen=True)
class AsmStatement:
    """One `asm [volatile] ("template" : outputs : inputs : clobbers);` statement."""

    statement: Node  # the expression_statement holding the asm
    keyword: str  # "asm" or "asm volatile"
    template: str  # the assembly template, string pieces joined and escapes decoded
    outputs: tuple[tuple[str, str], ...]  # (constraint, C expression) in operand order
    inputs: tuple[tuple[str, str], ...]
    clobbers: tuple[str, ...]  # as written, quotes included
    operand_nodes: tuple[Node, ...]  # value nodes of outputs then inputs (the %N numbering)

    @property
    def operands(self) -> tuple[tuple[str, str], ...]:
        return self.outputs + self.inputs

    @property
    def instruction(self) -> str:
        """The template as one instruction without the trailing `;` and whitespace."""
        return self.template.strip().rstrip(";").strip()


def read_asm(parsed: cp.ParsedSource, node: Node) -> AsmStatement:
    """The parts of a gnu_asm_expression; NotApplicable when it is not a whole statement of its own."""
    statement = node.parent
    if statement is None or statement.type != "expression_statement" or statement.parent is None \
            or statement.parent.type != "compound_statement":
        raise NotApplicable("the asm is not a statement of its own inside a block")
    qualifiers = [parsed.text(c) for c in node.children if c.type == "gnu_asm_qualifier"]
    if any(q != "volatile" for q in qualifiers):
        raise NotApplicable(f"asm qualifiers {qualifiers} are not supported (only volatile)")
    code = node.child_by_field_name("assembly_code")

    def operands(field_name: str) -> list[tuple[str, str, Node]]:
        group = node.child_by_field_name(field_name)
        found = []
        if group is None:
            return found
        for operand in group.named_children:
            if operand.type not in ("gnu_asm_output_operand", "gnu_asm_input_operand"):
                continue
            if operand.child_by_field_name("symbol") is not None:
                raise NotApplicable("named asm operands ([name] \"r\"(x)) are not supported")
            constraint = operand.child_by_field_name("constraint")
            value = operand.child_by_field_name("value")
            found.append((cp.string_value(parsed, constraint), parsed.text(value), value))
        return found

    outputs, inputs = operands("output_operands"), operands("input_operands")
    clobber_group = node.child_by_field_name("clobbers")
    clobbers = tuple(parsed.text(c) for c in clobber_group.named_children if c.type == "string_literal") \
        if clobber_group is not None else ()
    if node.child_by_field_name("goto_labels") is not None:
        raise NotApplicable("asm goto is not supported")
    return AsmStatement(
        statement=statement,
        keyword="asm volatile" if qualifiers else "asm",
        template=cp.string_value(parsed, code) if code is not None else "",
        outputs=tuple((c, t) for c, t, _ in outputs),
        inputs=tuple((c, t) for c, t, _ in inputs),
        clobbers=clobbers,
        operand_nodes=tuple(v for _, _, v in outputs + inputs),
    )


def split_operands(text: str) -> list[str]:
    """Split `a, f(b, c), d[1]` at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


_OPERAND_REF = re.compile(r"^%(\d+)$")


def operand_groups(asm: AsmStatement, opcode_pattern: re.Pattern[str]) -> tuple[re.Match[str], list[list[int]]]:
    """Match the instruction's opcode and return its operand groups as operand numbers:
    `op {%0, %1}, [%2]` -> [[0, 1], [2]]. NotApplicable for anything but one plain instruction."""
    instruction = asm.instruction
    if "\n" in instruction or ";" in instruction or "{" in instruction.split(" ", 1)[0]:
        raise NotApplicable("the asm template is not a single instruction")
    opcode, _, rest = instruction.partition(" ")
    match = opcode_pattern.fullmatch(opcode)
    if match is None:
        raise NotApplicable(f"unsupported instruction form {opcode!r}")
    groups = []
    for group in split_operands(rest):
        inner = group[1:-1] if group[:1] in "{[" and group[-1:] in "}]" else group
        numbers = []
        for ref in split_operands(inner):
            found = _OPERAND_REF.fullmatch(ref.strip())
            if found is None or int(found.group(1)) >= len(asm.operands):
                raise NotApplicable(f"operand {ref!r} of {opcode} is not a C operand reference")
            numbers.append(int(found.group(1)))
        groups.append(numbers)
    return match, groups


def marker_line(asm: AsmStatement, opcode: str, operands: str, indent: str,
                verbatim: tuple[str, ...] = ()) -> str:
    """The comment recording the asm statement that the scalar block replaces: the instruction with
    its C operands, the operands on a `//     ` continuation line when one line would be too long,
    then the `verbatim` lines (from `verbatim_lines`; none when the canonical layout restores the
    statement), each at the marker's indentation."""
    how = asm.keyword + (f" (clobbers {', '.join(asm.clobbers)})" if asm.clobbers else "")
    head = f"{MARKER}{how}: {opcode}"
    if len(indent) + len(head) + len(operands) + 2 <= LINE_WIDTH:
        lines = [f"{head} {operands};"]
    else:
        lines = [head, f"{indent}{_CONTINUATION}{operands};"]
    lines += [indent + line for line in verbatim]
    return "\n".join(lines)


# The replaced statement, line by line, when forward's canonical layout would not give it back
# byte for byte. Without it forward(backward(x)) != x for an expert that lays its asm out its own way
# (conv2d/implicit_gemm splits its mma template after the B operands; gdn/chunked writes
# `{%0,%1,...}` without spaces), and the walk records that transition's forward step as failed.
# One comment line per source line: `//     verbatim: <text>`. The first line is the statement from
# `asm` on; a later line is recorded without the statement's indentation and restored at the
# marker's, so that a later transform that re-indents the marker (and the block) keeps the text
# valid and its relative indentation; an empty line is `//     verbatim:` alone.
VERBATIM = "//     verbatim:"


def verbatim_lines(parsed: cp.ParsedSource, asm: AsmStatement, indent: str, canonical: str) -> tuple[str, ...]:
    """The marker lines (without the indentation) that record `asm`'s statement as written, or ()
    when `canonical` (forward's rendering of the marker, as `render_asm` gives it) is that text
    already, so that a statement in the canonical layout keeps today's marker byte for byte.
    NotApplicable for a line a `//` comment cannot hold as it is (a trailing backslash would splice
    the next line into the comment; a carriage return) or one indented less than the statement
    (its indentation could not be restored relative to the marker's)."""
    original = parsed.text(asm.statement)
    if original == canonical:
        return ()
    recorded = []
    for number, line in enumerate(original.split("\n")):
        if line.endswith("\\") or "\r" in line:
            raise NotApplicable("the asm statement has a line a // comment cannot record verbatim "
                                "(a trailing backslash or a carriage return)")
        if number == 0:
            recorded.append(f"{VERBATIM} {line}")
        elif not line:
            recorded.append(VERBATIM)
        elif line.startswith(indent):
            recorded.append(f"{VERBATIM} {line[len(indent):]}")
        else:
            raise NotApplicable("a line of the asm statement is indented less than the statement itself; "
                                "the marker could not restore it verbatim")
    return tuple(recorded)


def restore_verbatim(verbatim: tuple[str, ...], indent: str) -> str:
    """The statement a marker's verbatim lines record (the texts after `//     verbatim:`), its
    first line without indentation (it is spliced where the marker starts), later lines at
    `indent`: the inverse of `verbatim_lines`."""
    lines = []
    for number, text in enumerate(verbatim):
        if not text:
            lines.append("")
        else:
            lines.append(text[1:] if number == 0 else indent + text[1:])
    return "\n".join(lines)


_CONTINUATION = "//     "


_MARKER = re.compile(r"^// scalarized (?P<keyword>asm(?: volatile)?)(?: \(clobbers (?P<clobbers>[^)]*)\))?: "
                     r"(?P<opcode>\S+)(?: (?P<operands>.*);)?$")


@dataclass(frozen=True)
class MarkedBlock:
    """A scalarized site: the marker comment(s) and the block after them."""

    comment: Node  # the first marker line
    block: Node
    keyword: str
    clobbers: tuple[str, ...]
    opcode: str
    groups: list[list[str]]  # operand groups as C expressions
    # The texts after `//     verbatim:` of the marker's verbatim lines (each "" or " <line>"), or
    # () when the statement was in the canonical layout; `restore_verbatim` rebuilds it.
    verbatim: tuple[str, ...] = ()


def marker_groups(operands: str) -> list[list[str]]:
    """A marker's operand text `{d0, d1}, [addr]` as groups of C expressions [[d0, d1], [addr]]."""
    groups = []
    for group in split_operands(operands):
        inner = group[1:-1] if group[:1] in "{[" and group[-1:] in "}]" else group
        groups.append(split_operands(inner))
    return groups


def read_marker(parsed: cp.ParsedSource, comment: Node) -> MarkedBlock | None:
    match = _MARKER.match(parsed.text(comment))
    if match is None:
        return None
    block = comment.next_named_sibling
    operands = match.group("operands")
    if operands is None:  # on the continuation line
        text = parsed.text(block) if block is not None and block.type == "comment" else ""
        if not text.startswith(_CONTINUATION) or not text.endswith(";"):
            return None
        operands = text[len(_CONTINUATION):-1].strip()
        block = block.next_named_sibling
    verbatim = []
    while block is not None and block.type == "comment":
        text = parsed.text(block)
        if text != VERBATIM and not text.startswith(VERBATIM + " "):
            return None
        verbatim.append(text[len(VERBATIM):])
        block = block.next_named_sibling
    if block is None or block.type != "compound_statement":
        return None
    clobbers = tuple(split_operands(match.group("clobbers"))) if match.group("clobbers") else ()
    return MarkedBlock(comment, block, match.group("keyword"), clobbers, match.group("opcode"),
                       marker_groups(operands), tuple(verbatim))


def restored_asm(parsed: cp.ParsedSource, marked: MarkedBlock, canonical: str) -> str:
    """What forward splices in place of a marker and its block: the statement as the marker
    recorded it verbatim, or else `canonical` (the marker rendered by `render_asm`)."""
    if marked.verbatim:
        return restore_verbatim(marked.verbatim, indentation(parsed.data, marked.comment.start_byte))
    return canonical


def render_asm(indent: str, keyword: str, template: str, outputs: list[str], inputs: list[str],
               clobbers: tuple[str, ...] = ()) -> str:
    """The canonical layout of an asm statement (its first line without the indent, since it is
    spliced where the replaced text starts): the template on one line, split after the opcode when
    that line would pass LINE_WIDTH columns, then `: outputs` and `: inputs` aligned under it."""
    head = f"{keyword}("
    pad = indent + " " * len(head)
    whole = f'{head}"{template}\\n"'
    if len(indent) + len(whole) > LINE_WIDTH and " " in template:
        opcode, rest = template.split(" ", 1)
        lines = [f'{head}"{opcode} "', f'{pad}"{rest}\\n"']
    else:
        lines = [whole]
    lines.append(f"{pad}: {', '.join(outputs)}")
    last = f"{pad}: {', '.join(inputs)}"
    if clobbers:
        lines.append(last)
        last = f"{pad}: {', '.join(clobbers)}"
    lines.append(last + ");")
    return "\n".join(lines)


def one_dimensional_blocks(state: KernelState) -> bool:
    return all(str(launch.block[1]).strip() == "1" and str(launch.block[2]).strip() == "1"
               for launch in state.plan.launches)


def lane_expression(state: KernelState) -> str:
    """The lane index: threadIdx.x & 31 when every launch of the plan has a 1-D block, else the
    linear thread index & 31 (a warp is 32 consecutive linear thread indices)."""
    return f"{thread_index(state)} & 31"


def warp_expression(state: KernelState) -> str:
    return f"{thread_index(state)} >> 5"


def thread_index(state: KernelState) -> str:
    if one_dimensional_blocks(state):
        return "threadIdx.x"
    return "((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x)"


def identifiers(parsed: cp.ParsedSource, node: Node) -> set[str]:
    return {parsed.text(n) for n in cp.nodes_of_type(node, "identifier", "field_identifier", "type_identifier")}


def check_names(parsed: cp.ParsedSource, nodes: tuple[Node, ...] | list[Node], names: set[str], what: str) -> None:
    """The generated block declares `names`; an operand that uses one of them would see the new one."""
    clash = set()
    for node in nodes:
        clash |= identifiers(parsed, node) & names
    if clash:
        raise NotApplicable(f"{what}: operand names {sorted(clash)} clash with the scalar code's locals")


def function_node(parsed: cp.ParsedSource, name: str) -> Node:
    found = [f for f in cp.functions(parsed) if f.name == name]
    if not found:
        raise NotApplicable(f"no function named {name!r}")
    if len(found) > 1:
        raise NotApplicable(f"{len(found)} functions are named {name!r} (overloads): the anchor is ambiguous")
    return found[0].node


def site_key(function: str, index: int, count: int) -> str:
    return function if count == 1 and index == 0 else f"{function}#{index}"


def site_index(anchor: Anchor) -> int:
    _, _, number = anchor.key.partition("#")
    return int(number) if number.isdigit() else 0


def wrap(expression: str, limit: int, indent: str) -> str:
    """`lhs = f(g(...))` on one line, or broken after the outermost `(` of the right-hand side when
    the line would pass `limit` columns."""
    if len(indent) + len(expression) <= limit:
        return indent + expression
    cut = expression.find("(", expression.find("= ") + 2 if "= " in expression else 0)
    return f"{indent}{expression[:cut + 1]}\n{indent}    {expression[cut + 1:]}"


@dataclass(frozen=True)
class Site:
    """One site of an asm-helper transform: the asm (the mechanism) or its scalarized form."""

    asm: Node | None  # the gnu_asm_expression, or
    marked: MarkedBlock | None  # the marker comment and scalar block
    code: str = ""  # the asm template

    @property
    def start(self) -> int:
        return self.asm.start_byte if self.asm is not None else self.marked.comment.start_byte


def asm_sites(parsed: cp.ParsedSource, mnemonic: str, function: str | None = None) -> dict[str, list[Site]]:
    """Per function, in source order: inline asm using `mnemonic` (e.g. "ldmatrix") and marker
    blocks that replaced such asm."""
    sites: dict[str, list[Site]] = {}
    pattern = re.compile(rf"\b{re.escape(mnemonic)}\.")
    for block in cp.asm_blocks(parsed):
        if block.function and pattern.search(block.code) and function in (None, block.function):
            sites.setdefault(block.function, []).append(Site(block.node, None, block.code))
    for comment in cp.nodes_of_type(parsed.root, "comment"):
        owner = cp.function_of(comment)
        if owner is None or function not in (None, owner):
            continue
        marked = read_marker(parsed, comment)
        if marked is not None and marked.opcode.startswith(mnemonic + "."):
            sites.setdefault(owner, []).append(Site(None, marked))
    return {name: sorted(found, key=lambda s: s.start) for name, found in sites.items()}


def asm_anchors(parsed: cp.ParsedSource, mnemonic: str) -> list[Anchor]:
    anchors = []
    for function, sites in asm_sites(parsed, mnemonic).items():
        for i, site in enumerate(sites):
            if site.asm is not None:
                snippet = site.code.strip().split(" ", 1)[0]
                anchors.append(Anchor(function, "asm", site_key(function, i, len(sites)), snippet))
    return anchors


def asm_site(parsed: cp.ParsedSource, mnemonic: str, anchor: Anchor) -> Site:
    """The site an anchor names; the ordinal counts the sites of every function of that name, so
    overloads (ldmatrix_x2, ldmatrix_x4 as one overloaded name) stay distinct."""
    if not any(f.name == anchor.function for f in cp.functions(parsed)):
        raise NotApplicable(f"no function named {anchor.function!r}")
    sites = asm_sites(parsed, mnemonic, anchor.function).get(anchor.function, [])
    index = site_index(anchor)
    if index >= len(sites):
        raise NotApplicable(f"{anchor.function} has no {mnemonic} site #{index}")
    return sites[index]


def restore_marked(transform: Transform, state: KernelState, anchor: Anchor, mnemonic: str, what: str) -> Rewrite:
    """The forward of a scalarizing transform: the marked block at `anchor` becomes the asm statement
    its marker describes again (`transform.canonical_asm` renders it; the verbatim record wins)."""
    parsed = cp.parse(state.source)
    site = asm_site(parsed, mnemonic, anchor)
    if site.marked is None:
        raise NotApplicable(f"{anchor} already uses {what}")
    marked = site.marked
    indent = indentation(parsed.data, marked.comment.start_byte)
    canonical = transform.canonical_asm(indent, marked.keyword, marked.opcode, marked.groups, marked.clobbers, anchor)
    text = restored_asm(parsed, marked, canonical)
    source = splice(parsed.data, [(marked.comment.start_byte, marked.block.end_byte, text)])[0].decode("utf-8")
    return transform.rewrite(state, anchor, Direction.FORWARD, source, note=f"restored {marked.opcode}")
